#!/bin/bash
#SBATCH --nodes=1
#SBATCH --exclusive
#SBATCH --time=08:00:00
./bench
