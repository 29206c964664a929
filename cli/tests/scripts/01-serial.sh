#!/bin/bash
#SBATCH --job-name=serial
#SBATCH --output=%x-%j.out
#SBATCH --time=00:10:00
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=2G
python3 -c 'print(1)'
