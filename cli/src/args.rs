//! `quorum`'s command line: the parser of every subcommand (each module of [`crate::commands`]
//! holds its own arguments). [`crate::man`] makes the man pages from it.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::commands;

#[derive(Parser)]
#[command(name = "quorum", version, about = "Quorum: a batch scheduler with a replicated control plane")]
pub struct Cli {
    #[command(flatten)]
    pub controllers: quorum_client::client::ControllersArg,
    /// Answer reads (queue, show, nodes) from the first replica that answers, at once, without
    /// confirming with the leader that nothing newer was committed; the index answered at is
    /// printed on standard error. For when there is no leader, or to spare it.
    #[arg(long, global = true)]
    pub stale: bool,
    #[command(subcommand)]
    pub command: Command,
}

// `defer`: only the invoked subcommand's arguments are built. Building (and dropping) all
// thirty was a third of the instructions of a `quorum submit`, which scripts run by the
// thousand; help, errors and the man pages are the same (clap builds the rest when asked).
#[derive(Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Submit a batch script or a command: `quorum submit job.sh` or `quorum submit -- CMD ARGS`.
    Submit(commands::submit::Args),
    /// The job queue, like squeue.
    Queue(commands::queue::Args),
    /// One job in detail, like scontrol show job.
    Show(commands::show::Args),
    /// Cancel jobs.
    Cancel(commands::cancel::Args),
    /// Print a job's output, read on its node (the first by default); -f follows a running
    /// job until it ends, like kubectl logs -f.
    Logs(commands::logs::Args),
    /// Hold pending jobs so that they do not start.
    Hold(commands::hold::Args),
    /// Release held jobs.
    Release(commands::hold::Args),
    /// Send running jobs back to the queue (their processes are killed; they start again).
    Requeue(commands::hold::Args),
    /// Change jobs after their submit, like scontrol update: `quorum update 12 TimeLimit=30
    /// Partition=short` (a running job: its time limit, name and comment only).
    Update(commands::update::Args),
    /// Freeze running jobs where they run, keeping their nodes, like scontrol suspend
    /// (operators); their time limits wait.
    Suspend(commands::hold::Args),
    /// Thaw suspended jobs, like scontrol resume (operators).
    Resume(commands::hold::Args),
    /// Recurring jobs, like scrontab: `quorum cron add "0 2 * * *" --tz local nightly.sh`,
    /// `quorum cron list`, `quorum cron remove ID`.
    #[command(subcommand)]
    Cron(commands::cron::Args),
    /// Advance reservations, like scontrol create|update|delete|show reservation (the same
    /// KEY=VALUE words): `quorum reservation create ReservationName=maint StartTime=now+1hour
    /// Duration=120 Nodes=n[1-4] Users=root Flags=MAINT`.
    #[command(subcommand)]
    Reservation(commands::reservation::Args),
    /// Each pending job's priority and its factors, like sprio.
    Prio(commands::prio::Args),
    /// The account tree with shares, usage and fairshare factors, like sshare.
    Share(commands::share::Args),
    /// A token that proves who you are where MUNGE cannot (off the cluster), like scontrol token.
    Token(commands::token::Args),
    /// Who the cluster takes you for, and your role.
    Whoami(commands::whoami::Args),
    /// Operator and admin commands.
    Admin {
        #[command(subcommand)]
        command: commands::admin::Command,
    },
    /// The nodes, like sinfo.
    Nodes(commands::nodes::Args),
    /// Copy a file to every node of a job's allocation, like sbcast (the same options:
    /// `quorum bcast -f ./app /tmp/app` inside salloc or sbatch).
    #[command(disable_help_flag = true)]
    Bcast {
        /// sbcast's options and arguments (see sbcast(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Jobs as accounting records them, ended ones from the job history included, like sacct
    /// (the same options: `quorum acct -j 12 -o JobID,State,Elapsed --parsable2`).
    #[command(disable_help_flag = true)]
    Acct {
        /// sacct's options and arguments (see sacct(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// What a running job uses now, like sstat (the same options: `quorum stat -j 12`).
    #[command(disable_help_flag = true)]
    Stat {
        /// sstat's options and arguments (see sstat(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// How efficiently a job used its CPUs and memory, like seff (`quorum eff 12`).
    #[command(disable_help_flag = true)]
    Eff {
        /// seff's options and arguments (see seff(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// CPU and GPU time by account and user over a period, like sreport (`quorum report
    /// cluster AccountUtilizationByUser start=2026-11-01`, `quorum report user TopUsage`).
    #[command(disable_help_flag = true)]
    Report {
        /// sreport's options and arguments (see sreport(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Each controller replica's Raft status.
    Cluster(commands::cluster::Args),
    /// Link the Slurm command names this program answers to (`scontrol show hostnames`, ...)
    /// into DIR; an agent started with `--slurm-commands DIR` puts DIR on its jobs' PATH.
    InstallSlurmCommands {
        /// Where the links go, such as /usr/local/lib/quorum/slurm.
        dir: PathBuf,
        /// Also write the man pages under this directory (into its man1/), such as
        /// /usr/local/share/man: `man sbatch` then answers.
        #[arg(long)]
        man: Option<PathBuf>,
    },
    /// Write the man pages of quorum, each of its subcommands and each Slurm command name into
    /// DIR/man1 (MANPATH=DIR man sbatch), generated from the parsers themselves.
    Man {
        /// Where the pages go (DIR/man1), such as /usr/local/share/man.
        dir: PathBuf,
    },
    /// Replay a workload trace (SWF) through the scheduler in virtual time and report waits,
    /// slowdown and utilization (run by quorum-dev; `quorum simulate --help`).
    #[command(disable_help_flag = true)]
    Simulate {
        /// Its options, as quorum-dev parses them (see quorum-simulate(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Load generators against a real cluster (its own unless told otherwise): submit,
    /// dispatch, agents, memory, failover (run by quorum-dev; `quorum bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        /// Its options, as quorum-dev parses them (see quorum-bench(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run three controller replicas and two agents in one process, on loopback (run by
    /// quorum-dev; `quorum dev --help`).
    #[command(disable_help_flag = true)]
    Dev {
        /// Its options, as quorum-dev parses them (see quorum-dev(1)).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The subcommands are built on demand (`defer`), and building one applies the metadata of
    /// what it flattens: a doc comment on a flattened struct would replace the subcommand's own
    /// description in `quorum --help` once built, and in its man page.
    #[test]
    fn building_a_subcommand_keeps_its_description() {
        let described = |cmd: &clap::Command| -> Vec<_> {
            cmd.get_subcommands()
                .filter(|s| s.get_name() != "help")
                .map(|s| {
                    (
                        s.get_name().to_string(),
                        s.get_about().map(|a| a.to_string()),
                        s.get_long_about().map(|a| a.to_string()),
                    )
                })
                .collect()
        };
        let eager = described(&super::Cli::command());
        let mut built = super::Cli::command();
        built.build();
        let after = described(&built);
        assert!(eager.len() > 20, "{eager:?}");
        assert_eq!(eager, after);
    }
}
