"""Operators: the logical specs a pipeline author creates and the runtime pieces that execute them.

A logical :class:`~epochal.operators.specs.OperatorSpec` lives in the (pure, picklable)
graph; inside a task it creates a :class:`~epochal.operators.base.RuntimeOperator`.
"""
