//! `quorum man DIR` (and `quorum install-slurm-commands DIR --man MANDIR`): the man pages of
//! `quorum`, each of its subcommands and each Slurm command name, generated from the parsers
//! themselves, so a page cannot promise an option the command does not take. `quorum dev`,
//! `simulate` and `bench` belong to `quorum-dev`, which writes theirs (`quorum-dev man DIR`).

use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;

/// The subcommands whose parser is `quorum-dev`'s.
const OF_QUORUM_DEV: &[&str] = &["dev", "simulate", "bench"];

/// Writes every page into `dir/man1` and says where (`MANPATH=dir man sbatch` reads them).
pub fn write_all(dir: &Path) -> anyhow::Result<ExitCode> {
    let mut written = quorum_client::manual::write_pages(crate::args::Cli::command(), dir, OF_QUORUM_DEV)?;
    for name in crate::slurm::names() {
        let cmd = crate::slurm::command(name).expect("every linked name has a parser");
        written.extend(quorum_client::manual::write_pages(cmd, dir, &[])?);
    }
    let beside = std::env::current_exe()?.with_file_name("quorum-dev");
    let dev = if beside.is_file() {
        let status = std::process::Command::new(&beside).arg("man").arg(dir).status()?;
        anyhow::ensure!(status.success(), "{} man {}: {status}", beside.display(), dir.display());
        "with quorum-dev's (dev, simulate, bench)"
    } else {
        "without quorum-dev's (dev, simulate, bench): it is not beside this program"
    };
    println!("{} pages in {}, {dev}", written.len(), dir.join("man1").display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::Parser;

    /// Every subcommand and option the parsers accept says what it does, so every man page
    /// describes all of it.
    #[test]
    fn every_subcommand_and_option_is_documented() {
        let mut missing = quorum_client::manual::undocumented(&crate::args::Cli::command());
        for name in crate::slurm::names() {
            missing.extend(quorum_client::manual::undocumented(&crate::slurm::command(name).unwrap()));
        }
        assert!(missing.is_empty(), "without a description, so missing from the man pages:\n{}", missing.join("\n"));
    }

    /// Every Slurm name `quorum` answers to has a parser, so a page, and sreport, once run but
    /// not linked, is linked.
    #[test]
    fn every_command_quorum_answers_to_has_a_page() {
        for name in crate::slurm::names() {
            assert!(crate::slurm::command(name).is_some(), "{name} has no parser");
        }
        assert!(crate::slurm::names().any(|n| n == "sreport"));
        let dir = tempfile::tempdir().unwrap();
        let written =
            quorum_client::manual::write_pages(crate::slurm::command("sbatch").unwrap(), dir.path(), &[]).unwrap();
        let page = std::fs::read_to_string(&written[0]).unwrap();
        assert!(page.contains("kill\\-on\\-invalid\\-dep"), "sbatch's page lacks an option: {page}");
    }

    /// The programs the manual's commands start with.
    fn programs() -> Vec<&'static str> {
        let mut p = vec!["quorum"];
        p.extend(crate::slurm::names());
        p
    }

    /// Every command shown in the README, the manual (docs/) and the runbook parses: its
    /// subcommand and options exist and take the values given.
    #[test]
    fn every_command_shown_in_the_docs_parses() {
        let files = quorum_client::manual::manual_files(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")));
        let mut checked = 0;
        let mut wrong = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let file = file.display();
            let programs = programs();
            let shown = quorum_client::manual::shell_commands(&text, &programs).into_iter().map(|c| (c, false));
            let inline = quorum_client::manual::inline_commands(&text, &programs).into_iter().map(|c| (c, true));
            for ((line, words), inline) in shown.chain(inline) {
                let outcome = if words[0] == "quorum" {
                    if words.get(1).is_some_and(|w| OF_QUORUM_DEV.contains(&w.as_str())) {
                        continue; // quorum-dev's own test checks these
                    }
                    crate::args::Cli::try_parse_from(&words).map(|_| ())
                } else {
                    parse_slurm(&words[0], &words[1..])
                };
                checked += 1;
                if let Err(e) = outcome {
                    // Prose names a command without its arguments (`quorum show` prints ...).
                    let named = inline
                        && matches!(
                            e.kind(),
                            ErrorKind::MissingRequiredArgument
                                | ErrorKind::MissingSubcommand
                                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                        );
                    if !named && !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                        let first = e.to_string().lines().next().unwrap_or_default().to_string();
                        wrong.push(format!("{file}:{line}: `{}`: {first}", words.join(" ")));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "commands in the docs that do not parse:\n{}", wrong.join("\n"));
        assert!(checked >= 150, "only {checked} commands found in {files:?}");
    }

    /// `name args` as the command would parse it; `sbatch`'s heterogeneous components (`:`)
    /// one by one.
    fn parse_slurm(name: &str, args: &[String]) -> Result<(), clap::Error> {
        let cmd = crate::slurm::command(name).unwrap();
        if name == "sbatch" {
            for part in args.split(|a| a == ":") {
                cmd.clone().try_get_matches_from(part)?;
            }
            return Ok(());
        }
        cmd.try_get_matches_from(args).map(|_| ())
    }

    #[test]
    fn a_wrong_option_in_the_docs_would_be_caught() {
        let md = "```sh\nsbatch --no-such-option job.sh\nquorum submit --frobnicate -- true\nsqueue --me\n```\n";
        let found = quorum_client::manual::shell_commands(md, &programs());
        let failures: Vec<bool> = found
            .iter()
            .map(|(_, w)| {
                if w[0] == "quorum" {
                    crate::args::Cli::try_parse_from(w).is_err()
                } else {
                    parse_slurm(&w[0], &w[1..]).is_err()
                }
            })
            .collect();
        assert_eq!(failures, vec![true, true, false]);
    }
}
