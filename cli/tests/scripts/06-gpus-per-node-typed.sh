#!/bin/bash
#SBATCH --nodes=1
#SBATCH --gpus-per-node=h100:2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=3
#SBATCH --mem=64000M
#SBATCH --time=1-00:00:00
srun python train.py
