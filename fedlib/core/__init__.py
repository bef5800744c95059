"""The federated round: state, start models, stages, selection, the server's attention, metrics and ``simulate``.

A round is select -> start models -> local update -> aggregate -> evaluate; ``simulate`` runs rounds of an
``Algorithm`` (a composition of stages) with the executor, schedule and callbacks its caller passes. Nothing here
reads or writes files, handles signals or names a paper's experiment.
"""
