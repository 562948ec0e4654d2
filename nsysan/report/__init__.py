"""Report documents and their text formats: :mod:`.document` builds one from an overview and
findings, :mod:`.renderers` writes it as terminal text, JSON, Markdown or HTML.

Deliberately empty of imports, so ``nsysan.report.formats`` costs the command line nothing; the
pipeline that produces a document is :func:`nsysan.analysis.analyse`.
"""
