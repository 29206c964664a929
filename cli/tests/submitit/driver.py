"""Drives a Quorum cluster through submitit's Slurm executor, unmodified: the Slurm commands it
calls (sbatch, srun, sacct, scancel) are Quorum's. Prints one JSON object with what came back."""

import json
import sys
import time

import submitit


def add(a, b):
    env = submitit.JobEnvironment()
    return {"sum": a + b, "job_id": env.job_id, "rank": env.global_rank, "tasks": env.num_tasks}


def fail():
    raise ValueError("failed on purpose")


def final_state(job, within_s=60):
    """The job's state from sacct once it has ended. submitit's result() returns as soon as the
    job wrote its result, while the job is still RUNNING until its script exits (on Slurm too),
    so the state is read again until it is no longer RUNNING or PENDING."""
    deadline = time.monotonic() + within_s
    while True:
        state = job.watcher.get_state(job.job_id, mode="force")
        if state not in ("RUNNING", "PENDING", "COMPLETING") or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def main(folder):
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(time=5, mem="64MB", cpus_per_task=1, comment="from submitit")
    single = executor.submit(add, 2, 3)
    out = {"single_id": single.job_id, "single": single.result(), "single_state": final_state(single)}

    failing = executor.submit(fail)
    try:
        failing.result()
        out["failing"] = "no error"
    except Exception as e:  # submitit re-raises the job's exception as a FailedJobError
        out["failing"] = f"{type(e).__name__}: {'failed on purpose' in str(e)}"

    executor.update_parameters(array_parallelism=2)
    jobs = executor.map_array(add, [1, 2, 3], [10, 20, 30])
    out["array"] = [j.result()["sum"] for j in jobs]
    out["array_ids"] = [j.job_id for j in jobs]
    out["array_states"] = [final_state(j) for j in jobs]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
