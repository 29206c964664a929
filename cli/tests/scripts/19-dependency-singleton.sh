#!/bin/bash
#SBATCH --dependency=singleton
#SBATCH --job-name=chain
#SBATCH --time=5:00
./step
