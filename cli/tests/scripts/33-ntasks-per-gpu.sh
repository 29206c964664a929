#!/bin/bash
#SBATCH --gpus=2
#SBATCH --ntasks-per-gpu=2
#SBATCH --time=10
srun ./worker
