//! Man pages generated from the command definitions themselves (`clap_mangen`), so that what
//! `man sbatch` says is what `sbatch` parses, and the checks that keep the manual honest: every
//! option and subcommand has a description ([`undocumented`]), and every command the Markdown
//! manual shows still parses ([`shell_commands`] finds them).

use std::path::{Path, PathBuf};

/// Writes the page of `cmd` (as `NAME.1`) and of each of its subcommands, recursively (as
/// `NAME-SUB.1`, as git names its pages), into `dir/man1`, made if missing. Subcommands named
/// in `elsewhere` are left out (their pages come from another program). Returns the files.
pub fn write_pages(cmd: clap::Command, dir: &Path, elsewhere: &[&str]) -> std::io::Result<Vec<PathBuf>> {
    let dir = dir.join("man1");
    std::fs::create_dir_all(&dir)?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    write_tree(&cmd, &dir, elsewhere, &mut written)?;
    Ok(written)
}

/// Writes the pages of the subcommands of `cmd` named in `names` and of theirs, as
/// [`write_pages`] does, but not the page of `cmd` itself (another program writes it).
pub fn write_subcommand_pages(cmd: clap::Command, dir: &Path, names: &[&str]) -> std::io::Result<Vec<PathBuf>> {
    let dir = dir.join("man1");
    std::fs::create_dir_all(&dir)?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    for sub in cmd.get_subcommands().filter(|s| names.contains(&s.get_name())) {
        write_tree(sub, &dir, &[], &mut written)?;
    }
    Ok(written)
}

fn write_tree(cmd: &clap::Command, dir: &Path, elsewhere: &[&str], written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && !elsewhere.contains(&s.get_name())) {
        write_tree(sub, dir, &[], written)?;
    }
    let page =
        clap_mangen::Man::new(cmd.clone()).manual("Quorum").source(format!("Quorum {}", env!("CARGO_PKG_VERSION")));
    written.push(page.generate_to(dir)?);
    Ok(())
}

/// Every visible subcommand without a description and every visible argument without help, of
/// `cmd` and its subcommands, as `PATH --option` (or `PATH <VALUE>` for a positional one).
pub fn undocumented(cmd: &clap::Command) -> Vec<String> {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut found = Vec::new();
    walk(&cmd, cmd.get_name(), &mut found);
    found
}

fn walk(cmd: &clap::Command, path: &str, found: &mut Vec<String>) {
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if matches!(arg.get_id().as_str(), "help" | "version") {
            continue;
        }
        if arg.get_help().is_none() && arg.get_long_help().is_none() {
            let name = match (arg.get_long(), arg.get_short()) {
                (Some(long), _) => format!("--{long}"),
                (None, Some(short)) => format!("-{short}"),
                (None, None) => format!("<{}>", arg.get_id()),
            };
            found.push(format!("{path} {name}"));
        }
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let sub_path = format!("{path} {}", sub.get_name());
        if sub.get_about().is_none() && sub.get_long_about().is_none() {
            found.push(sub_path.clone());
        }
        walk(sub, &sub_path, found);
    }
}

/// The Markdown files whose commands must parse: the README, the runbook and every page of
/// the manual, under the repository's `root`.
pub fn manual_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("deploy/RUNBOOK.md")];
    if let Ok(pages) = std::fs::read_dir(root.join("docs")) {
        let mut pages: Vec<PathBuf> = pages
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        pages.sort();
        files.extend(pages);
    }
    files
}

/// The command lines in the ```sh blocks of a Markdown text that start with one of `programs`,
/// split into words as the shell would (quotes removed; `$VAR` and `$(...)` left as written):
/// lines joined where they end in `\`, comments dropped, and `&&`, `||`, `;`, `|` and `&`
/// separating commands. Each comes with its line number, for the error.
pub fn shell_commands(markdown: &str, programs: &[&str]) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    let mut pending_from = 0;
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            in_sh = !in_sh && matches!(lang.trim(), "sh" | "bash" | "shell" | "console");
            continue;
        }
        if !in_sh {
            continue;
        }
        if pending.is_empty() {
            pending_from = n + 1;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            None => pending.push_str(line),
        }
        let whole = std::mem::take(&mut pending);
        for segment in segments(&whole) {
            let Some(words) = shlex::split(&segment) else { continue };
            if words.first().is_some_and(|w| programs.contains(&w.as_str())) {
                found.push((pending_from, words));
            }
        }
    }
    found
}

/// The commands written inline in a Markdown text's prose (`` `sbatch --test-only job.sh` ``,
/// a span may wrap onto the next line) that start with one of `programs` and hold only literal
/// words: no `...`, no `[optional]` part, no placeholder in capitals (`quorum show JOB`).
/// Split as the shell would; each with the line its paragraph starts on.
pub fn inline_commands(markdown: &str, programs: &[&str]) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let mut fenced = false;
    let mut paragraph = String::new();
    let mut from = 0;
    let lines: Vec<&str> = markdown.lines().chain(std::iter::once("")).collect();
    for (n, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || line.trim().is_empty() || line.trim_start().starts_with("```") {
            for (i, span) in std::mem::take(&mut paragraph).split('`').enumerate() {
                if i % 2 == 0 || span.contains("...") || span.contains('[') {
                    continue;
                }
                let Some(words) = shlex::split(span) else { continue };
                let placeholder = |w: &String| w.len() > 1 && w.chars().all(|c| c.is_ascii_uppercase());
                if words.len() > 1 && programs.contains(&words[0].as_str()) && !words.iter().any(placeholder) {
                    found.push((from, words));
                }
            }
            continue;
        }
        if paragraph.is_empty() {
            from = n + 1;
        }
        paragraph.push_str(line);
        paragraph.push(' ');
    }
    found
}

/// `line` cut at its comment and at the shell's command separators, outside quotes.
fn segments(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let (mut single, mut double) = (false, false);
    let mut depth = 0usize; // inside $( ... ): one command's words
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let last = out.last_mut().expect("never empty");
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '(' if !single && i > 0 && chars[i - 1] == '$' => depth += 1,
            ')' if !single && depth > 0 => depth -= 1,
            '#' if !single && !double && depth == 0 && (i == 0 || chars[i - 1].is_whitespace()) => break,
            '&' | '|' | ';' if !single && !double && depth == 0 => {
                while i + 1 < chars.len() && matches!(chars[i + 1], '&' | '|') {
                    i += 1;
                }
                out.push(String::new());
                i += 1;
                continue;
            }
            _ => {}
        }
        last.push(c);
        i += 1;
    }
    out.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_found_in_sh_blocks_only_and_split_as_the_shell_would() {
        let md = "quorum submit outside\n```sh\nquorum submit -J 'a b' -- echo hi   # a comment\n\
                  sbatch --wrap \"x; y\" && squeue --me | head\nexport A=1; quorum cancel 2 &\n\
                  quorum admin account lab \\\n    --users ann\nTOKEN=$(quorum token --lifespan 1h | sed s/x//)\n```\n\
                  ```toml\nquorum = 1\n```\n";
        let found = shell_commands(md, &["quorum", "sbatch", "squeue"]);
        let words: Vec<Vec<&str>> = found.iter().map(|(_, w)| w.iter().map(String::as_str).collect()).collect();
        assert_eq!(
            words,
            vec![
                vec!["quorum", "submit", "-J", "a b", "--", "echo", "hi"],
                vec!["sbatch", "--wrap", "x; y"],
                vec!["squeue", "--me"],
                vec!["quorum", "cancel", "2"],
                vec!["quorum", "admin", "account", "lab", "--users", "ann"],
            ]
        );
        assert_eq!(found[4].0, 6, "the line a continued command starts on");
    }

    #[test]
    fn inline_commands_are_literal_ones_and_may_wrap() {
        let md = "Run `quorum submit\n--hold -- true`, see `quorum show JOB` and `sbatch [OPTIONS]`.\n\n\
                  ```sh\nquorum cancel 1\n```\n`squeue --me` and `quorum`.\n";
        let words: Vec<Vec<String>> =
            inline_commands(md, &["quorum", "squeue", "sbatch"]).into_iter().map(|(_, w)| w).collect();
        assert_eq!(words, vec![vec!["quorum", "submit", "--hold", "--", "true"], vec!["squeue", "--me"]]);
    }

    #[test]
    fn an_option_without_help_is_found() {
        let cmd = clap::Command::new("t")
            .arg(clap::Arg::new("told").long("told").help("Said."))
            .arg(clap::Arg::new("silent").long("silent"))
            .subcommand(clap::Command::new("sub").arg(clap::Arg::new("x").short('x')))
            .subcommand(clap::Command::new("ok").about("Said."));
        assert_eq!(undocumented(&cmd), vec!["t --silent", "t sub", "t sub -x"]);
    }

    #[test]
    fn pages_are_written_for_the_command_and_its_subcommands() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = clap::Command::new("q")
            .about("Top.")
            .subcommand(
                clap::Command::new("submit")
                    .about("Submit.")
                    .arg(clap::Arg::new("time").long("time").help("The limit.")),
            )
            .subcommand(clap::Command::new("dev").about("Elsewhere."));
        let written = write_pages(cmd, dir.path(), &["dev"]).unwrap();
        let names: Vec<String> =
            written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, vec!["q-submit.1", "q.1"]);
        let page = std::fs::read_to_string(dir.path().join("man1/q-submit.1")).unwrap();
        assert!(page.contains("The limit."), "{page}");
        assert!(page.contains("\\-\\-time"), "{page}");
    }
}
