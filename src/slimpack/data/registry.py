"""The datasets shipped inside the package: short name -> file, source column and provenance line.

The arrays live in ``bundled/<name>.npz`` (array ``lengths``, smallest unsigned dtype, data order
kept); ``scripts/bundle_lengths.py`` rebuilds them from the CSVs named here. Full provenance
(commits, licences, tokenizers) is in ``bundled/PROVENANCE.md``.

Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class BundledSpec:
    name: str
    """Short name users type (``slimpack datasets wikipedia``)."""
    source_csv: str
    """File name of the original CSV in the shared length-data folder."""
    column: str
    """Column of that CSV holding the token count."""
    source: str
    """One provenance line: what the documents are, where the numbers come from, licence."""

    @property
    def file(self) -> str:
        """Name of the compact array file under ``bundled/``."""
        return f"{self.name}.npz"


BUNDLED: dict[str, BundledSpec] = {spec.name: spec for spec in (
    BundledSpec(
        name="wikipedia", source_csv="flexsp_wikipedia.csv", column="length",
        source="Wikipedia documents sampled by FlexSP (ASPLOS'25), tokenizer undocumented; "
               "PKU-DAIR/Hetu-Galvatron@b4666892 galvatron/datasets/wikipedia.txt; Apache-2.0"),
    BundledSpec(
        name="textbooks", source_csv="distca_textbookchapters_llama3.csv", column="length",
        source="TextbookChapters (ProLong mix), Llama-3 tokenizer; "
               "hao-ai-lab/DistCA@2afd2192 distca/simulator/data/dist_prolong.json; Apache-2.0"),
    BundledSpec(
        name="wlbllm", source_csv="distca_wlbllm_reconstructed.csv", column="length",
        source="reconstruction of the WLB-LLM (OSDI'25) pre-training length distribution, 128K cap "
               "(artificial shape); hao-ai-lab/DistCA@2afd2192 "
               "distca/simulator/data/dist_wlbllm.json; Apache-2.0"),
    BundledSpec(
        name="cpython", source_csv="cpython-3.11.7_stdlib_py_cl100k_qwen3.csv", column="tokens_qwen3",
        source="every .py file of the CPython 3.11.7 standard library, Qwen3 tokenizer; PSF-2.0"),
    BundledSpec(
        name="pydocs", source_csv="debian_python3.11-doc_rst_cl100k_qwen3.csv", column="tokens_qwen3",
        source="reStructuredText sources of the Python 3.11 docs (Debian python3.11-doc 3.11.2), "
               "Qwen3 tokenizer; PSF-2.0"),
)}
