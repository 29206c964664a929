#!/bin/bash
#SBATCH --mail-type=BEGIN,END,FAIL
#SBATCH --mail-user=someone@example.org
#SBATCH --time=00:30:00
#SBATCH --ntasks=1
./job
