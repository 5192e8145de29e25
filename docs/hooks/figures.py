"""MkDocs hook: the committed benchmark figures (benchmarks/figures/*.png) join
the site as figures/*.png, so the pages show them without a second copy
inside docs/; and the plots beside the results a page includes
(docs/results/**/*.png) are published though their folder is not (mkdocs.yml's
exclude_docs: its markdown is only ever included into a page)."""
import os

from mkdocs.structure.files import File, InclusionLevel

FIGURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "benchmarks", "figures")


def on_files(files, config):
    for file in files:
        if file.src_uri.startswith("results/") and file.src_uri.endswith(".png"):
            file.inclusion = InclusionLevel.NOT_IN_NAV
    for name in sorted(os.listdir(FIGURES)):
        if name.endswith(".png"):
            files.append(File(f"figures/{name}", src_dir=os.path.dirname(FIGURES),
                              dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files
