#!/bin/bash
#SBATCH --frobnicate=3
#SBATCH --time=10
./prog
