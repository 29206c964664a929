#!/bin/bash
#SBATCH --gres=gpu:a100:1
#SBATCH --time=10
python a.py
