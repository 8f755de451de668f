//! Long jobs a controller runs beside its reconciles (a backup, a restore):
//! started once per id, their progress read while they run, their outcome
//! taken once when they end. The controller keeps what it reports (a
//! terminal status) in its own outputs; this holds only what runs now.
//!
//! ```text
//!   reconcile ── tasks.seen(id) ──> Absent  ─ start(id, job) ─┐
//!                                   Running(progress %)  <────┘ (Requeue::After)
//!                                   Ended(outcome)  (once; then Absent)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backupstore::Progress;

/// What a job of this id is doing now.
#[derive(Debug)]
pub enum Seen<T> {
    /// No job of this id runs (never started, or its end already taken).
    Absent,
    /// It runs; its progress in percent.
    Running(u32),
    /// It ended: its outcome, given once.
    Ended(Result<T, String>),
}

#[derive(Debug)]
struct Job<T> {
    progress: Arc<Progress>,
    task: tokio::task::JoinHandle<Result<T, String>>,
}

/// The jobs of one controller, by id.
#[derive(Debug)]
pub struct Tasks<T> {
    /// What a job is, for the outcome of one that panicked or was aborted
    /// ("backup task: ...").
    what: &'static str,
    jobs: Mutex<BTreeMap<String, Job<T>>>,
}

impl<T: Send + 'static> Tasks<T> {
    /// No jobs yet; `what` names them in the outcome of one that panicked.
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            jobs: Mutex::default(),
        }
    }

    fn jobs(&self) -> MutexGuard<'_, BTreeMap<String, Job<T>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `job` as `id`, which reports into `progress`. Callers start an
    /// id only when `seen` says `Absent`; a job of the same id still tracked
    /// would run on to its end unobserved (never aborted between two of its
    /// steps), as `keep_only` without abort leaves one.
    pub fn start<F>(&self, id: &str, progress: Arc<Progress>, job: F)
    where
        F: Future<Output = Result<T, String>> + Send + 'static,
    {
        let task = tokio::spawn(job);
        self.jobs().insert(id.to_owned(), Job { progress, task });
    }

    /// What job `id` is doing; an ended job's outcome is given here once.
    pub async fn seen(&self, id: &str) -> Seen<T> {
        let ended = {
            let mut jobs = self.jobs();
            match jobs.get(id) {
                None => return Seen::Absent,
                Some(j) if !j.task.is_finished() => return Seen::Running(j.progress.get()),
                Some(_) => jobs.remove(id),
            }
        };
        match ended {
            Some(j) => Seen::Ended(match j.task.await {
                Ok(outcome) => outcome,
                Err(e) => Err(format!("{}: {e}", self.what)),
            }),
            None => Seen::Absent,
        }
    }

    /// Forgets the jobs whose id is not in `wanted`, aborting them when
    /// `abort` (else they run to their end unobserved); their ids.
    pub fn keep_only(&self, wanted: &BTreeSet<String>, abort: bool) -> Vec<String> {
        let mut dropped = Vec::new();
        self.jobs().retain(|id, j| {
            let keep = wanted.contains(id);
            if !keep {
                if abort {
                    j.task.abort();
                }
                dropped.push(id.clone());
            }
            keep
        });
        dropped
    }

    /// The id of a job still tracked (running, or ended and not yet seen).
    pub fn any(&self) -> Option<String> {
        self.jobs().keys().next().cloned()
    }

    /// The ids of the jobs tracked.
    pub fn ids(&self) -> BTreeSet<String> {
        self.jobs().keys().cloned().collect()
    }

    /// Whether no job is tracked.
    pub fn is_empty(&self) -> bool {
        self.jobs().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_runs_then_ends_once() {
        let tasks: Tasks<u32> = Tasks::new("test task");
        assert!(matches!(tasks.seen("a").await, Seen::Absent));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tasks.start("a", Arc::default(), async move {
            let _ = rx.await;
            Ok(7)
        });
        assert!(matches!(tasks.seen("a").await, Seen::Running(0)));
        assert_eq!(tasks.any().as_deref(), Some("a"));
        let _ = tx.send(());
        let outcome = loop {
            match tasks.seen("a").await {
                Seen::Running(_) => tokio::task::yield_now().await,
                Seen::Ended(o) => break o,
                Seen::Absent => panic!("the end of job a was lost"),
            }
        };
        assert_eq!(outcome, Ok(7));
        assert!(matches!(tasks.seen("a").await, Seen::Absent));
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn a_panicked_job_ends_in_an_error_naming_it() {
        let tasks: Tasks<()> = Tasks::new("restore task");
        tasks.start("p", Arc::default(), async { panic!("boom") });
        let outcome = loop {
            match tasks.seen("p").await {
                Seen::Ended(o) => break o,
                _ => tokio::task::yield_now().await,
            }
        };
        let e = outcome.expect_err("a panic is an error");
        assert!(e.starts_with("restore task: "), "{e}");
    }

    #[tokio::test]
    async fn keep_only_forgets_and_aborts_the_unwanted() {
        let tasks: Tasks<()> = Tasks::new("test task");
        let pending = || async { std::future::pending::<Result<(), String>>().await };
        tasks.start("keep", Arc::default(), pending());
        tasks.start("drop", Arc::default(), pending());
        let dropped = tasks.keep_only(&["keep".to_string()].into(), true);
        assert_eq!(dropped, vec!["drop".to_string()]);
        assert!(matches!(tasks.seen("drop").await, Seen::Absent));
        assert!(matches!(tasks.seen("keep").await, Seen::Running(_)));
    }
}
