//! `quorum-supervisor`: the job supervisor as a program of its own, which the agent starts for
//! each job rank when it lies beside the agent's program ([`quorum_agent::supervisor`]). It
//! links the supervisor and little else, so that starting one costs little; it is not to be run
//! by hand.

fn main() -> std::process::ExitCode {
    quorum_agent::supervisor::program_main()
}
