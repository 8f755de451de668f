//! fio report: reads the JSON-lines result files that `benches/fio/run.sh` appends to, prints a
//! markdown table per job and label, and draws an SVG bar chart (IOPS per job, one bar per label:
//! engine, replicas, frontend, ...).
//!
//! ```text
//!   run.sh --label engine=v2,replicas=2 ──> results.jsonl ─┐
//!   run.sh --label engine=v1,frontend=iscsi ──> ... ───────┤
//!                        cargo bench --bench fio_report -- [--svg OUT.svg] FILE...
//!                                                          ├──> markdown table (stdout)
//!                                                          └──> SVG chart (default target/fio-report.svg)
//! ```
//!
//! Without files (plain `cargo bench`) it reads `$TALON_FIO_RESULTS` (comma-separated) and else
//! says there is nothing to report. Several runs of one (label, job) are averaged.
//! IOPS and MiB/s are read + write; latencies are fio's completion latency (clat) percentiles of
//! the direction with more I/Os (reads in the 70/30 mix).

use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::Value;

/// One fio job run, reduced to what the report shows.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    iops: f64,
    mib_s: f64,
    p50_us: f64,
    p99_us: f64,
}

fn sample(fio: &Value) -> Result<Sample, String> {
    let job = &fio["jobs"][0];
    if !job.is_object() {
        return Err("no jobs[0] in the fio output".into());
    }
    if job["error"].as_i64() != Some(0) {
        return Err(format!("fio reported error {}", job["error"]));
    }
    let (r, w) = (&job["read"], &job["write"]);
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let dom = if f(&r["total_ios"]) >= f(&w["total_ios"]) {
        r
    } else {
        w
    };
    let pct = |p: &str| f(&dom["clat_ns"]["percentile"][p]) / 1000.0;
    Ok(Sample {
        iops: f(&r["iops"]) + f(&w["iops"]),
        mib_s: (f(&r["bw_bytes"]) + f(&w["bw_bytes"])) / 1_048_576.0,
        p50_us: pct("50.000000"),
        p99_us: pct("99.000000"),
    })
}

/// (job, label) -> samples, in file order.
type Results = BTreeMap<(String, String), Vec<Sample>>;

fn read_results(path: &Path, into: &mut Results, labels: &mut Vec<String>) -> Result<usize, Box<dyn Error>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut n = 0;
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let rec: Value = serde_json::from_str(line)
            .map_err(|e| format!("{} line {}: not JSON: {e}", path.display(), i + 1))?;
        let (Some(label), Some(job)) = (rec["label"].as_str(), rec["job"].as_str()) else {
            return Err(format!("{} line {}: no label or job", path.display(), i + 1).into());
        };
        let s = sample(&rec["fio"])
            .map_err(|e| format!("{} line {} ({job}, {label}): {e}", path.display(), i + 1))?;
        if !labels.iter().any(|l| l == label) {
            labels.push(label.to_string());
        }
        into.entry((job.to_string(), label.to_string()))
            .or_default()
            .push(s);
        n += 1;
    }
    Ok(n)
}

fn mean(v: &[Sample]) -> Sample {
    let n = v.len().max(1) as f64;
    let sum = |g: fn(&Sample) -> f64| v.iter().map(g).sum::<f64>() / n;
    Sample {
        iops: sum(|s| s.iops),
        mib_s: sum(|s| s.mib_s),
        p50_us: sum(|s| s.p50_us),
        p99_us: sum(|s| s.p99_us),
    }
}

fn table(res: &Results) -> String {
    let mut out = String::from(
        "| job | label | runs | IOPS | MiB/s | clat p50 (us) | clat p99 (us) |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for ((job, label), v) in res {
        let m = mean(v);
        out += &format!(
            "| {job} | {label} | {} | {:.0} | {:.1} | {:.1} | {:.1} |\n",
            v.len(),
            m.iops,
            m.mib_s,
            m.p50_us,
            m.p99_us
        );
    }
    out
}

fn chart(res: &Results, labels: &[String], out: &Path) -> Result<(), Box<dyn Error>> {
    let jobs: Vec<&String> = {
        let mut j: Vec<&String> = res.keys().map(|(j, _)| j).collect();
        j.dedup();
        j
    };
    let max = res.values().map(|v| mean(v).iops).fold(1.0_f64, f64::max);
    let width = (160 * jobs.len()).max(640) as u32;
    let root = SVGBackend::new(out, (width, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut c = ChartBuilder::on(&root)
        .caption("fio: IOPS per job (read + write), log scale", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // log scale: engines and frontends differ by orders of magnitude (TCG guest vs. a host)
        .build_cartesian_2d(0f64..jobs.len() as f64, (1f64..max * 2.0).log_scale())?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(jobs.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 {
                jobs.get(i).map(|j| j.to_string()).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("IOPS")
        .draw()?;
    let nl = labels.len().max(1) as f64;
    for (li, label) in labels.iter().enumerate() {
        let color = Palette99::pick(li).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = jobs
            .iter()
            .enumerate()
            .filter_map(|(ji, job)| {
                let v = res.get(&((*job).clone(), label.clone()))?;
                let x0 = ji as f64 + 0.1 + 0.8 * li as f64 / nl;
                let x1 = x0 + 0.8 / nl;
                Some(Rectangle::new(
                    [(x0, 1.0), (x1, mean(v).iops.max(1.0))],
                    color.filled(),
                ))
            })
            .collect();
        c.draw_series(bars)?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut svg = PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()))
        .join("fio-report.svg");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--svg" => svg = args.next().ok_or("--svg needs a path")?.into(),
            // cargo bench passes --bench; other harness flags do not apply
            s if s.starts_with("--") => {}
            f => files.push(f.into()),
        }
    }
    if files.is_empty()
        && let Ok(list) = std::env::var("TALON_FIO_RESULTS")
    {
        files.extend(list.split(',').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    if files.is_empty() {
        println!(
            "fio_report: no result files (pass them after --, or set TALON_FIO_RESULTS); produce them with benches/fio/run.sh"
        );
        return Ok(());
    }
    let mut res = Results::new();
    let mut labels = Vec::new();
    let mut n = 0;
    for f in &files {
        n += read_results(f, &mut res, &mut labels)?;
    }
    if n == 0 {
        return Err(format!("no fio results in {files:?}").into());
    }
    print!("{}", table(&res));
    if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    chart(&res, &labels, &svg).map_err(|e| format!("cannot draw {}: {e}", svg.display()))?;
    println!("\n{n} runs, {} labels; chart: {}", labels.len(), svg.display());
    Ok(())
}
