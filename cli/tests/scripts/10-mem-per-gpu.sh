#!/bin/bash
#SBATCH --gpus-per-node=2
#SBATCH --mem-per-gpu=8G
#SBATCH --time=3:00:00
python infer.py
