#!/bin/bash
#SBATCH --constraint=skylake
#SBATCH --time=10
./prog
