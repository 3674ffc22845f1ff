"""Strip from committed notebooks the images that nbval never compares (they are megabytes per re-run).

nbval leaves ``image/png`` and ``image/jpeg`` out of its comparison of a cell's outputs with the
committed ones, so committing them only grows the repository, by megabytes each time a chapter is
re-executed. This removes them and keeps every other output (``text/plain``, ``text/html``, streams)
and all metadata. jupyter-cache keys a notebook by its code cells and their metadata, never by its
outputs, so a stripped chapter still matches the executed copy that ``make outputs`` cached before
stripping, and ``make book`` shows the figures of that execution (a fresh clone, with no cache,
executes the chapters again).

Run: python tools/strip_images.py NOTEBOOK...   (``make outputs`` runs it on book/*.ipynb)
"""

import sys

import nbformat

STRIPPED = ("image/png", "image/jpeg")
"""The MIME types nbval skips when it compares outputs (it compares any other, SVG included)."""


def strip_images(nb: nbformat.NotebookNode) -> int:
    """Remove the ``STRIPPED`` data of every output of a notebook, in place.

    Parameters
    ----------
    nb : nbformat.NotebookNode
        A notebook as read by ``nbformat.read``.

    Returns
    -------
    int
        The number of images removed (0: the notebook is unchanged).
    """
    removed = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            for mime in STRIPPED:
                if output.get("data", {}).pop(mime, None) is not None:
                    removed += 1
                output.get("metadata", {}).pop(mime, None)  # an image's width and height
    return removed


def main(paths: list[str]) -> None:
    """Strip the notebooks at ``paths`` in place; rewrite only those that held images."""
    for path in paths:
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        removed = strip_images(nb)
        if removed:
            nbformat.write(nb, path)
        print(f"{path}: {removed} image(s) removed")


if __name__ == "__main__":
    main(sys.argv[1:])
