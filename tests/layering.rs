//! Every `crate::` arrow between talon's top-level modules runs one way: no
//! two modules use each other (doc comments and unit-test modules aside).
//! Read from the sources, so a new circle fails here with the files named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn top_level_modules_use_each_other_one_way_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules: BTreeSet<String> = std::fs::read_dir(&src)
        .expect("src")
        .filter_map(|e| {
            let p = e.ok()?.path();
            let n = p.file_stem()?.to_str()?.to_owned();
            (n != "lib" && n != "main").then_some(n)
        })
        .collect();
    // module -> used module -> a file that uses it
    let mut uses: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for m in &modules {
        let mut files = Vec::new();
        let dir = src.join(m);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        } else {
            files.push(src.join(format!("{m}.rs")));
        }
        for f in files {
            let text = std::fs::read_to_string(&f).expect("source");
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    let used: String = line[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if &used != m && modules.contains(&used) {
                        uses.entry(m.clone())
                            .or_default()
                            .entry(used)
                            .or_insert_with(|| f.display().to_string());
                    }
                }
            }
        }
    }
    let mut circles = Vec::new();
    for (a, used) in &uses {
        for (b, file) in used {
            if a < b
                && let Some(back) = uses.get(b).and_then(|u| u.get(a))
            {
                circles.push(format!("{a} <-> {b} ({file}; {back})"));
            }
        }
    }
    assert!(circles.is_empty(), "modules that use each other: {circles:#?}");
}
