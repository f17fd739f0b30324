"""The file workflow: tables in and out (CSV, Parquet, JSON lines), the engine run over a
file, the evaluation, reconstruction and attack commands on published files, sdcMicro-shaped
risk and k-anonymity commands, and the HTML utility report. The only part of ``gateway`` that
reads or writes data tables; the engine, mechanisms and measures never import it.
"""
