#!/bin/bash
#SBATCH --job-name=nightly-eval
#SBATCH --begin=now+1hour
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --ntasks=2 --cpus-per-task=2
#SBATCH -t 0-02
srun ./eval
