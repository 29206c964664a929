#!/bin/bash
#SBATCH --ntasks=4
#SBATCH --hint=nomultithread
#SBATCH --distribution=block:block
#SBATCH --ntasks-per-core=1
#SBATCH --time=00:15:00
srun ./app
