#!/bin/bash
#SBATCH --time=2-12
#SBATCH --cpus-per-task=8
#SBATCH --mem=24G
./long_run
