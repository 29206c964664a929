#!/bin/bash
#SBATCH -J omp
#SBATCH -c 4
#SBATCH --mem-per-cpu=2000
#SBATCH -t 2:00:00
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
./solver
