#!/bin/bash
#SBATCH --nodes=2
#SBATCH --tasks-per-node=2
#SBATCH --gpus-per-task=2
#SBATCH --time=1:00:00
srun ./z
