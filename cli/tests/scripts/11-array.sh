#!/bin/bash
#SBATCH --array=1-20%5
#SBATCH --output=logs/%A_%a.out
#SBATCH --error=logs/%A_%a.err
#SBATCH --time=0:20:00
#SBATCH --mem=4G
python task.py $SLURM_ARRAY_TASK_ID
