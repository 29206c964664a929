#!/bin/bash
#SBATCH --begin=teatime
#SBATCH --gid=0
#SBATCH --mem=2G
#SBATCH --time=45:00
python3 report.py
