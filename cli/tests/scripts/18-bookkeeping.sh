#!/bin/bash
#SBATCH --comment="nightly build"
#SBATCH --wckey=ci
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --time=10
make test
