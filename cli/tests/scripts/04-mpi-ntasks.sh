#!/bin/bash
#SBATCH --ntasks=12
#SBATCH --mem-per-cpu=1G
#SBATCH --time=30
srun hostname
