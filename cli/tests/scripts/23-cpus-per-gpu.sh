#!/bin/bash
#SBATCH --gpus-per-task=1
#SBATCH --ntasks=2
#SBATCH --cpus-per-gpu=3
#SBATCH --time=30
srun python a.py
