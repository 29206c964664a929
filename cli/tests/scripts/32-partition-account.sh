#!/bin/bash
#SBATCH --partition=gpu
#SBATCH --account=myproject
#SBATCH --qos=normal
#SBATCH --gres=gpu:1
#SBATCH --time=10
./job
