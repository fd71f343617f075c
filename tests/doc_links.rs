//! The documentation's links hold: every relative link of README.md and docs/**/*.md names a
//! file or directory of the repository, every `#anchor` into a Markdown file names one of its
//! headings (GitHub's slugs), and README.md stays a front page (fewer than 150 lines).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 150;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every *.md under docs/, sorted.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut files);
    files.sort();
    files
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<(char, usize)> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let run = marker.map_or(0, |c| trimmed.chars().take_while(|x| *x == c).count());
        match (fence, marker) {
            (None, Some(c)) if run >= 3 => fence = Some((c, run)),
            (Some((c, n)), Some(m)) if m == c && run >= n && trimmed[run..].trim().is_empty() => fence = None,
            (None, _) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// A line without its inline code spans (`...`, ``...``): links are not read inside them.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|c| *c == '`').count();
        let delimiter = "`".repeat(run);
        let after = &rest[start + run..];
        match after.find(&delimiter) {
            Some(end) => rest = &after[end + run..],
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the inline links `[text](target)` (and images) of a line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let inner = after[..end].trim();
        let target = if let Some(angled) = inner.strip_prefix('<') {
            angled.split('>').next().unwrap_or_default()
        } else {
            inner.split_whitespace().next().unwrap_or_default()
        };
        targets.push(target.to_string());
        rest = &after[end + 1..];
    }
    targets
}

/// GitHub's anchor of a heading: lowercase, characters other than alphanumerics, '-', '_' and
/// spaces dropped, spaces turned into '-'.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's ATX headings (a repeated heading gets `-1`, `-2`, ...).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let trimmed = line.trim_start_matches(' ');
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        if indent > 3 || level == 0 || level > 6 {
            continue;
        }
        let rest = &trimmed[level..];
        if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        let title = rest.trim().trim_end_matches('#').trim_end();
        let base = slug(title);
        let count = seen.entry(base.clone()).or_insert(0);
        out.push(if *count == 0 { base.clone() } else { format!("{base}-{count}") });
        *count += 1;
    }
    out
}

fn is_external(target: &str) -> bool {
    let lower = target.to_ascii_lowercase();
    ["http:", "https:", "mailto:"].iter().any(|scheme| lower.starts_with(scheme))
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// Every broken link and anchor of the given files, and an over-long README.
fn check(files: &[PathBuf]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut anchor_cache: HashMap<PathBuf, Option<Vec<String>>> = HashMap::new();
    let mut anchors_of = |path: &Path| -> Option<Vec<String>> {
        anchor_cache
            .entry(path.to_path_buf())
            .or_insert_with(|| fs::read_to_string(path).ok().map(|t| anchors(&t)))
            .clone()
    };
    for file in files {
        let text = match fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) => {
                failures.push(format!("{}: unreadable: {e}", relative(file)));
                continue;
            }
        };
        let dir = file.parent().expect("a file has a directory");
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                let (path_part, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let linked = if path_part.is_empty() { file.clone() } else { dir.join(path_part) };
                let at = format!("{}:{number}", relative(file));
                if !linked.exists() {
                    failures.push(format!("{at}: link `{target}`: {} does not exist", relative(&linked)));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if linked.extension().is_none_or(|ext| ext != "md") {
                    continue;
                }
                let known = anchors_of(&linked).unwrap_or_default();
                if !known.iter().any(|a| a == anchor) {
                    failures.push(format!(
                        "{at}: link `{target}`: no heading of {} has the anchor #{anchor} (it has: {})",
                        relative(&linked),
                        known.iter().map(|a| format!("#{a}")).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
        if file.file_name().is_some_and(|name| name == "README.md") && file.parent() == Some(root().as_path()) {
            let n = text.lines().count();
            if n >= README_MAX_LINES {
                failures.push(format!(
                    "README.md: {n} lines; the front page stays under {README_MAX_LINES} (move detail into docs/)"
                ));
            }
        }
        if file.starts_with(root().join("docs")) && !text.starts_with("# ") {
            failures.push(format!("{}: does not start with a `# Title` line", relative(file)));
        }
    }
    failures
}

#[test]
fn every_relative_link_and_anchor_of_the_docs_resolves() {
    let files = markdown_files();
    assert!(files.len() > 1, "no docs/*.md found");
    let failures = check(&files);
    assert!(failures.is_empty(), "{} broken documentation link(s):\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn github_slugs_and_link_parsing() {
    assert_eq!(slug("Targets split by tensor (`-sm tensor`)"), "targets-split-by-tensor--sm-tensor");
    assert_eq!(slug("Hybrid and recurrent targets (qwen35, ...)"), "hybrid-and-recurrent-targets-qwen35-");
    assert_eq!(slug("The adaptive walk (the controller)"), "the-adaptive-walk-the-controller");
    assert_eq!(anchors("# A\n## B b\n```\n# not a heading\n```\n## B b\n#not\n"), ["a", "b-b", "b-b-1"]);
    assert_eq!(
        link_targets("see [a](docs/a.md#x), `[b](no.md)` and ![c](img.png \"t\") [d](https://x.org/(y))"),
        ["docs/a.md#x", "img.png", "https://x.org/(y)"]
    );
}
