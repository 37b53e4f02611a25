"""The overhead benchmark's parts (benchmarks/overhead.py is the command): phases runs an engine through a plan,
judge and tokens read its token log, machine reads the host around it, summary and limits make one mode's
result, report writes it as markdown."""
