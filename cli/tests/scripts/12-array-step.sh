#!/bin/bash
#SBATCH -a 0-99:10
#SBATCH -c 2
#SBATCH -t 15
./run $SLURM_ARRAY_TASK_ID
