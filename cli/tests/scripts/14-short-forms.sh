#!/bin/bash
#SBATCH -J short -N 1 -n 4 -c 1 -t 5 -o out.txt
srun hostname
