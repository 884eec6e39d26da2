"""MkDocs hook: links from the docs to files of the repository outside docs/.

The pages link to repository files the way GitHub shows them, relative to the page
(``[multihost.md](../benchmarks/results/multihost.md)``,
``[own_model.py](../keras_examples/own_model.py)``). MkDocs only knows the files under
``docs/`` and, built with ``--strict``, fails on such links. This hook follows every
relative link of the pages (and of the files it adds, recursively) and, when the target
exists in the repository, adds it to the site at its repository path (a ``.md`` target
becomes a page of the site, anything else is copied) and rewrites the link to it. A link
to a file that does not exist is left alone, so ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.repo_links")

# [text](target) outside code; the target has no scheme and no leading '/' or '#'
_LINK = re.compile(r"(\]\()([^)\s#:]+)((?:#[^)\s]*)?\))")

_mirrored: dict[str, str] = {}      # repository path -> site path (a docs/ file: its path)


def _repo_root(config) -> str:
    return os.path.dirname(os.path.abspath(config["docs_dir"]))


def _docs_prefix(config) -> str:
    return os.path.relpath(os.path.abspath(config["docs_dir"]), _repo_root(config)) + "/"


def _outside_code(markdown: str):
    """(is_code, text) chunks: fenced blocks and inline code spans are left alone."""
    parts = re.split(r"(^```.*?^```[^\n]*$|`[^`\n]+`)", markdown, flags=re.M | re.S)
    for i, part in enumerate(parts):
        yield i % 2 == 1, part


def _links(markdown: str):
    for is_code, part in _outside_code(markdown):
        if not is_code:
            for m in _LINK.finditer(part):
                yield m.group(2)


def _site_path(repo_path: str, prefix: str) -> str:
    return repo_path[len(prefix):] if repo_path.startswith(prefix) else repo_path


def on_files(files, config):
    root, prefix = _repo_root(config), _docs_prefix(config)
    _mirrored.clear()
    queue = [prefix + f.src_uri for f in files.documentation_pages()]
    seen = set(queue)
    while queue:
        repo_path = queue.pop()
        with open(os.path.join(root, repo_path), encoding="utf-8") as fh:
            markdown = fh.read()
        for target in _links(markdown):
            target_repo = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path),
                                                            target))
            if (target_repo.startswith(prefix) or target_repo.startswith("../")
                    or target_repo in seen
                    or not os.path.isfile(os.path.join(root, target_repo))):
                continue      # a docs file, outside the repo, done, or missing (MkDocs warns)
            seen.add(target_repo)
            if files.get_file_from_path(target_repo) is not None:
                raise ValueError(f"repo_links: {target_repo} is both a docs file and a "
                                 f"repository file linked from {repo_path}")
            new = File(target_repo, src_dir=root, dest_dir=config["site_dir"],
                       use_directory_urls=config["use_directory_urls"])
            if any(f.dest_uri == new.dest_uri for f in files):
                raise ValueError(f"repo_links: {target_repo}, linked from {repo_path}, would "
                                 f"overwrite {new.dest_uri} of the site")
            files.append(new)
            _mirrored[target_repo] = target_repo
            if target_repo.endswith(".md"):
                queue.append(target_repo)
    return files


def on_page_markdown(markdown, page, config, files):
    prefix = _docs_prefix(config)
    page_repo = (page.file.src_uri if page.file.src_uri in _mirrored
                 else prefix + page.file.src_uri)

    def rewrite(m):
        target_repo = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo),
                                                        m.group(2)))
        if not (target_repo in _mirrored or target_repo.startswith(prefix)):
            return m.group(0)
        new = posixpath.relpath(_site_path(target_repo, prefix),
                                posixpath.dirname(page.file.src_uri) or ".")
        return m.group(1) + new + m.group(3)

    out = []
    for is_code, part in _outside_code(markdown):
        out.append(part if is_code else _LINK.sub(rewrite, part))
    return "".join(out)
