#!/bin/bash
#SBATCH --nodes=1-2
#SBATCH --ntasks=2
#SBATCH --time=10
srun hostname
