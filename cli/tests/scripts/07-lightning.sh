#!/bin/bash -l
#SBATCH --nodes=2             # nodes
#SBATCH --gres=gpu:h100:4     # GPUs per node
#SBATCH --ntasks-per-node=4   # one task per GPU
#SBATCH --cpus-per-task=2
#SBATCH --time=0-02:00:00
#SBATCH --signal=SIGUSR1@90
srun python lightning_train.py
