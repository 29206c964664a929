#!/bin/bash
#SBATCH --export=ALL,OMP_NUM_THREADS=2
#SBATCH --chdir=/tmp
#SBATCH --get-user-env
#SBATCH -c 2
#SBATCH -t 10
./prog
