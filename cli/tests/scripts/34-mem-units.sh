#!/bin/bash
#SBATCH --mem=1536M
#SBATCH --time=1:00
#SBATCH --cpus-per-task=2
./x
