#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=8
#SBATCH -t 01:00:00
#SBATCH -o mpi.%j.out
#SBATCH -e mpi.%j.err
srun ./a.out
