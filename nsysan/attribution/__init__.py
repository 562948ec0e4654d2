"""Step-time attribution: where each rank's step time went, which rank held each step back, and
what removing a cause would save.

It follows the map/reduce split of :mod:`nsysan.analysis`. The map (:func:`map_attribution`) reads
one export and returns compact tables: step windows, the breakdown of each step's GPU time, the
exposed pieces of communication, the NCCL operations and the export's part of the dependency
graph. The reduce (:func:`reduce_attribution`) aligns the ranks' clocks on matched collectives,
joins collectives across ranks, splits communication into waiting for a peer and transfer, and
builds the job's dependency graph, whose replay with a cause removed (:mod:`.whatif`) says how
much wall time that cause cost. Detectors read the result (:class:`JobAttribution`).
"""
