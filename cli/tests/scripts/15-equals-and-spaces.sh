#!/bin/bash
#SBATCH --job-name analysis
#SBATCH --ntasks 2
#SBATCH --time 1:00:00
#SBATCH --mem 8000
Rscript analysis.R
