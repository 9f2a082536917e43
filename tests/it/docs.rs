//! The documentation held to the tree: the README is a front door into `docs/`, every
//! relative link and anchor resolves, every page is reachable from the README and leads
//! back to it, and `redrive.example.toml` shows every key the settings hold. The code the
//! pages show is checked where it is used (`newcomers.rs`, `authoring.rs`) through the
//! helpers of `support::docs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Component, Path};

use crate::support::docs::{read, repository, section};

/// Longest the README may grow: a front door, not the manual.
const README_MAX_LINES: usize = 250;

/// The markdown files the docs are made of: the README and every `docs/*.md`.
fn markdown_files() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    files.extend(docs_pages());
    files
}

/// Every `docs/*.md`, as `docs/NAME.md`.
fn docs_pages() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(repository("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    pages
}

/// The text outside fenced code blocks: fenced lines are blanked, so line numbers stay.
fn prose(text: &str) -> String {
    let mut fenced: Option<&str> = None;
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let fence = ["```", "~~~"].into_iter().find(|f| trimmed.starts_with(f));
        match (fenced, fence) {
            (None, Some(f)) => {
                fenced = Some(f);
                lines.push("");
            }
            (Some(open), Some(f)) if open == f => {
                fenced = None;
                lines.push("");
            }
            (Some(_), _) => lines.push(""),
            (None, None) => lines.push(line),
        }
    }
    lines.join("\n")
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation dropped but for
/// `-` and `_`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown text's headings, as GitHub makes them: a repeated heading
/// gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose(text).lines() {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let heading = line[hashes..].trim().trim_end_matches('#');
        let base = anchor(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    anchors
}

/// A paragraph with its inline code spans blanked (a span may hold `](`).
fn without_code_spans(paragraph: &str) -> String {
    let chars: Vec<char> = paragraph.chars().collect();
    let mut out = String::new();
    let mut at = 0;
    while at < chars.len() {
        if chars[at] != '`' {
            out.push(chars[at]);
            at += 1;
            continue;
        }
        let run = chars[at..].iter().take_while(|c| **c == '`').count();
        let mut close = at + run;
        let end = loop {
            match (close..chars.len()).find(|i| chars[*i] == '`') {
                None => break None,
                Some(i) => {
                    let other = chars[i..].iter().take_while(|c| **c == '`').count();
                    if other == run {
                        break Some(i + run);
                    }
                    close = i + other;
                }
            }
        };
        match end {
            Some(end) => {
                out.push_str("CODE");
                at = end;
            }
            None => {
                out.extend(&chars[at..at + run]);
                at += run;
            }
        }
    }
    out
}

/// The targets of a markdown text's inline links and images (`[text](target)`), outside
/// code; external ones (`http:`, `https:`, `mailto:`) left out.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    for paragraph in prose(text).split("\n\n") {
        let paragraph = without_code_spans(paragraph);
        for (at, _) in paragraph.match_indices("](") {
            let rest = &paragraph[at + 2..];
            let Some(close) = rest.find(')') else {
                continue;
            };
            let target = rest[..close].split_whitespace().next().unwrap_or("");
            let external = ["http://", "https://", "mailto:"]
                .iter()
                .any(|scheme| target.starts_with(scheme));
            if !external {
                links.push(target.to_owned());
            }
        }
    }
    links
}

/// `target`'s path relative to `file`, as a repository path (`docs/../README.md` is
/// `README.md`); `None` when it leaves the repository.
fn resolve(file: &str, target: &str) -> Option<String> {
    let base = Path::new(file).parent().unwrap_or(Path::new(""));
    let mut parts: Vec<String> = Vec::new();
    for component in base.join(target).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

/// What is wrong with each relative link of `file`: a file that does not exist, an
/// anchor that is no heading of its page.
fn broken_links(file: &str, text: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for link in relative_links(text) {
        let (path, fragment) = match link.split_once('#') {
            Some((path, fragment)) => (path, Some(fragment)),
            None => (link.as_str(), None),
        };
        let target = if path.is_empty() {
            file.to_owned()
        } else {
            match resolve(file, path) {
                Some(target) if repository(&target).exists() => target,
                Some(target) => {
                    broken.push(format!("{file}: ({link}): {target} does not exist"));
                    continue;
                }
                None => {
                    broken.push(format!("{file}: ({link}): leaves the repository"));
                    continue;
                }
            }
        };
        let Some(fragment) = fragment else { continue };
        if !target.ends_with(".md") {
            broken.push(format!(
                "{file}: ({link}): an anchor into {target}, which is not markdown"
            ));
            continue;
        }
        let headings = if target == file {
            anchors(text)
        } else {
            anchors(&read(&target))
        };
        if !headings.contains(fragment) {
            broken.push(format!(
                "{file}: ({link}): {target} has no heading #{fragment} (it has: {})",
                headings.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        checked += relative_links(&text).len();
        broken.extend(broken_links(&file, &text));
    }
    assert!(checked > 100, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_finds_a_missing_file_a_missing_anchor_and_a_link_in_code() {
    let text = "# Page\n\n## A heading: with `code`\n\n## Twice\n\n## Twice\n\n\
                [fine](#a-heading-with-code), [again](#twice-1), [back](../README.md#the-demo)\n\
                [gone](nowhere.md), [lost](#no-such-heading), [deep](kafka.md#no-such-heading)\n\
                `[in code](nowhere-either.md)`\n\n```text\n[fenced](nowhere-at-all.md)\n```\n";
    let broken = broken_links("docs/page.md", text);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("(nowhere.md): docs/nowhere.md does not exist"));
    assert!(broken[1].contains("(#no-such-heading): docs/page.md has no heading"));
    assert!(broken[2].contains("(kafka.md#no-such-heading): docs/kafka.md has no heading"));
}

#[test]
fn every_docs_page_is_linked_from_the_readme_and_links_back() {
    let readme = read("README.md");
    let linked: BTreeSet<String> = (relative_links(&readme).iter())
        .filter_map(|link| resolve("README.md", link.split('#').next().unwrap()))
        .collect();
    for page in docs_pages() {
        assert!(linked.contains(&page), "README.md does not link {page}");
        let text = read(&page);
        let top: Vec<&str> = text.lines().take(5).collect();
        assert!(
            top[0].starts_with("# ") && top.iter().any(|l| l.contains("](../README.md)")),
            "{page} starts with its title and a link back to README.md:\n{}",
            top.join("\n")
        );
    }
}

#[test]
fn the_readme_is_a_front_door_into_the_docs() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into docs/"
    );
    let first = readme.split("```").nth(1).expect("a first code block");
    assert!(
        first.starts_with("bash\n") && first.lines().nth(1).unwrap().contains("-- demo"),
        "README.md opens with the demo command:\n{first}"
    );
    let headings: Vec<&str> = (readme.lines())
        .filter_map(|line| line.strip_prefix("## "))
        .collect();
    assert_eq!(
        headings,
        [
            "The demo",
            "After an incident: redrive safely",
            "To production",
            "Documentation"
        ]
    );
    assert!(
        readme.contains("](docs/console.png)"),
        "the console's picture"
    );

    let table = section("README.md", "Documentation");
    let rows: Vec<String> = (table.lines())
        .filter(|line| line.starts_with("| ["))
        .map(|row| {
            let link = relative_links(row);
            assert_eq!(link.len(), 1, "one page per row: {row}");
            resolve("README.md", &link[0]).unwrap()
        })
        .collect();
    let listed: BTreeSet<String> = rows.iter().cloned().collect();
    assert_eq!(rows.len(), listed.len(), "a page listed twice: {rows:?}");
    let pages: BTreeSet<String> = docs_pages().into_iter().collect();
    assert_eq!(
        listed, pages,
        "README's Documentation lists every docs page"
    );
}

/// The keys a settings value's `Debug` text shows, as paths (`["routes", "brake",
/// "window"]`): each field with the fields that hold it. Map keys and values are not
/// fields.
fn debug_keys(debug: &str) -> BTreeSet<Vec<String>> {
    let chars: Vec<char> = debug.chars().collect();
    let mut keys = BTreeSet::new();
    let mut open: Vec<Option<String>> = Vec::new();
    let mut pending: Option<String> = None;
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        match c {
            '"' => {
                at += 1;
                while chars[at] != '"' {
                    at += if chars[at] == '\\' { 2 } else { 1 };
                }
            }
            '{' | '[' | '(' => open.push(pending.take()),
            '}' | ']' | ')' => {
                open.pop();
                pending = None;
            }
            ',' => pending = None,
            c if c.is_ascii_lowercase() || c == '_' => {
                let start = at;
                while at < chars.len() && (chars[at].is_ascii_alphanumeric() || chars[at] == '_') {
                    at += 1;
                }
                let name: String = chars[start..at].iter().collect();
                let before = chars[..start].iter().rev().find(|c| **c != ' ');
                let field = matches!(before, Some('{') | Some(','))
                    && chars.get(at) == Some(&':')
                    && chars.get(at + 1) == Some(&' ');
                if field {
                    let mut path: Vec<String> = open.iter().flatten().cloned().collect();
                    path.push(name.clone());
                    keys.insert(path);
                    pending = Some(name);
                }
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    keys
}

/// The lines of `redrive.example.toml` by top-level section, its tables commented out
/// (`# [[routes]]`, `# [webhooks.billing]`) included.
fn example_sections(example: &str) -> BTreeMap<String, Vec<String>> {
    let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = String::new();
    for line in example.lines() {
        let table = line.trim_start_matches('#').trim_start();
        if table.starts_with('[') {
            current = (table.trim_start_matches('['))
                .split(['.', ']'])
                .next()
                .unwrap()
                .to_owned();
        }
        sections
            .entry(current.clone())
            .or_default()
            .push(line.to_owned());
    }
    sections
}

/// Whether `line` sets `key` (`key = ...`, also inside an inline table) or names it in a
/// table's path (`[admin.tokens.ops]`).
fn shows_key(line: &str, key: &str) -> bool {
    line.match_indices(key).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + key.len()..].trim_start();
        let whole = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        whole
            && (after.starts_with('=')
                || (before == Some('.') && (after.starts_with('.') || after.starts_with(']'))))
    })
}

#[test]
fn the_example_configuration_shows_every_key_the_settings_hold() {
    // Every table filled, so that every nested key shows in `Debug`.
    let every_table = r#"
[[routes]]
name = "orders"
topics = ["orders.dlt"]
mode = "capture"
handler = "log"
fetch_originals_from = ["orders"]
[[routes]]
topics = ["payments"]
mode = "process"
handler = "log"
brake = {}
[webhooks.billing]
url = "https://billing.internal/redrive"
[webhooks.billing.routes.orders]
url = "https://orders.internal/replay"
[handlers.billing]
max_concurrency = 8
[handlers.billing.breaker]
[admin.tokens.ops]
role = "operate"
token = "an-operate-token-of-32-characters"
"#;
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    file.write_all(every_table.as_bytes()).unwrap();
    let settings = redrive::Settings::load(Some(file.path()), Some(HashMap::new())).unwrap();
    let keys = debug_keys(&format!("{settings:?}"));
    // Fields `Debug` shows that no file sets: where the URL came from, and a webhook's
    // own target (its url, method, headers and body, which are keys).
    let not_keys = [vec!["database", "url_origin"], vec!["webhooks", "target"]];
    let sections = example_sections(&read("redrive.example.toml"));
    let mut missing = Vec::new();
    for path in &keys {
        if not_keys.iter().any(|not| not == path) {
            continue;
        }
        let lines = sections.get(&path[0]).map_or(&[][..], Vec::as_slice);
        let shown = match &path[..] {
            [_] => !lines.is_empty(),
            [.., key] => lines.iter().any(|line| shows_key(line, key)),
            [] => unreachable!(),
        };
        if !shown {
            missing.push(path.join("."));
        }
    }
    assert!(
        keys.len() > 80,
        "only {} keys read from {settings:?}",
        keys.len()
    );
    assert!(
        missing.is_empty(),
        "redrive.example.toml does not show these keys: {missing:?}"
    );
}
