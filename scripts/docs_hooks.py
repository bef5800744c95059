"""mkdocs hooks (mkdocs.yml ``hooks:``): the site's pages are docs/, but its notebooks and figures live at the
repository's top (notebooks/, figures/), where the repository's front page and GitHub link to them. This hook adds them
to the site's files as if they sat in docs/notebooks/ and docs/figures/, so pages link to ``notebooks/<name>.ipynb`` and
``figures/<name>.png``, mkdocs-jupyter renders the notebooks with their stored outputs, and ``mkdocs build
--strict`` checks every such link. Nothing is copied into docs/, so there is one copy of each file."""

from __future__ import annotations

import logging
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
# mkdocs-jupyter logs a line per notebook at INFO; its warnings still count for --strict (which `mkdocs build -q`
# would not: -q drops warnings before strict mode counts them)
for _name in ("mkdocs.plugins.mkdocs_jupyter", "mkdocs.mkdocs-jupyter"):
    logging.getLogger(_name).setLevel(logging.WARNING)

FOLDERS = {"notebooks": "*.ipynb", "figures": "*.paper.png"}  # folder at the top -> files the site takes from it


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files: Files, config) -> Files:
    for folder, pattern in FOLDERS.items():
        for path in sorted((ROOT / folder).glob(pattern)):
            uri = f"{folder}/{path.name}"
            if files.get_file_from_path(uri) is None:
                # a real file whose source folder is the repository's top (not File.generated: mkdocs-jupyter wraps
                # files and finds a generated one's source path empty)
                files.append(File(uri, str(ROOT), config.site_dir, config.use_directory_urls))
    return files
