"""The one namespace: the folders common/, rollout/, learner/ and coordinator/ install as
stabledrl.common, stabledrl.rollout, stabledrl.learner and stabledrl.coordinator beside the
stabledrl/ package itself (the API, the command line, evaluation and recipes). Everything else
about the build is in pyproject.toml."""
from setuptools import find_packages, setup

MAPPED = ("common", "rollout", "learner", "coordinator")
packages = ["stabledrl", *(f"stabledrl.{p}" for p in find_packages("stabledrl"))]
for folder in MAPPED:
    packages += [f"stabledrl.{folder}", *(f"stabledrl.{folder}.{p}" for p in find_packages(folder))]

setup(packages=packages, package_dir={"stabledrl": "stabledrl", **{f"stabledrl.{f}": f for f in MAPPED}})
