#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks=16
./big
