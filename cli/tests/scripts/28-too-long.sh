#!/bin/bash
#SBATCH --time=14-00:00:00
./forever
