#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks=3
#SBATCH --mem-per-cpu=500M
#SBATCH --time=20
srun ./y
