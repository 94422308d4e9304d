"""What results.db means: LongRCA scoring, paired statistics, repeatability, cost and reports.

Reads the store (read side) and the data layer; never calls a model and never writes results.
"""
