#!/bin/bash
#SBATCH -G 2
#SBATCH -n 2
#SBATCH --mem=16G
#SBATCH -t 4:00:00
srun nvidia-smi -L
