//! One table's rows streamed into its file (`TableWriter`): rows given as floats (encoded, their
//! quantisation error summed), as encoded bytes or by a function; the file sealed.

use super::*;

/// Streams the rows of one table into its file.
pub struct TableWriter {
    pub(super) spec: TableSpec,
    pub(super) layout: RowLayout,
    pub(super) file_name: String,
    pub(super) path: PathBuf,
    pub(super) pipeline: WritePipeline,
    /// The chunk being filled; rows `[chunk_index * chunk_rows, ...)` of the table.
    pub(super) chunk: Option<Vec<u8>>,
    chunk_rows: u64,
    chunk_bytes: usize,
    pub(super) rows_written: u64,
    /// Started by [`StoreWriter::keyed_table`] for this many keys: they come at the end.
    pub(super) keyed: Option<u64>,
    /// Its row 0 is a default row given by the caller, not zeros.
    pub(super) default_row: bool,
    /// The encoding error of the rows given as floats so far (a lossy dtype).
    pub(super) error: ErrorSum,
}

/// The encoding error summed over rows: the largest, the sum and the count of absolute errors.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ErrorSum {
    pub(super) max: f32,
    pub(super) sum: f64,
    pub(super) values: u64,
}

impl ErrorSum {
    pub(super) fn add(mut self, other: ErrorSum) -> ErrorSum {
        self.max = self.max.max(other.max);
        self.sum += other.sum;
        self.values += other.values;
        self
    }

    /// `values` against `decoded`.
    pub(super) fn of(values: &[f32], decoded: &[f32]) -> ErrorSum {
        let mut e = ErrorSum {
            values: values.len() as u64,
            ..ErrorSum::default()
        };
        for (a, b) in values.iter().zip(decoded) {
            let d = (a - b).abs();
            e.max = e.max.max(d);
            e.sum += f64::from(d);
        }
        e
    }

    fn report(self) -> Option<QuantError> {
        (self.values > 0).then(|| QuantError {
            max_abs: self.max,
            mean_abs: self.sum / self.values as f64,
            values: self.values,
        })
    }
}

impl TableWriter {
    /// A writer of table `spec` into a new file `file_name` of directory `dir`.
    pub(crate) fn create(
        dir: &Path,
        file_name: String,
        spec: TableSpec,
        progress: Option<ProgressFn>,
    ) -> Result<Self> {
        let path = dir.join(&file_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| FormatError::io(&path, e))?;
        let layout = spec.layout();
        let spans_per_chunk = (CHUNK_BYTES / layout.span_bytes()).max(1);
        let chunk_bytes = (spans_per_chunk * layout.span_bytes()) as usize;
        let pipeline = WritePipeline::start(file, path.clone(), progress);
        Ok(TableWriter {
            spec,
            layout,
            file_name,
            path,
            pipeline,
            chunk: None,
            chunk_rows: spans_per_chunk * layout.rows_per_span(),
            chunk_bytes,
            rows_written: 0,
            keyed: None,
            default_row: false,
            error: ErrorSum::default(),
        })
    }

    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    /// Takes `error` as the table's encoding error (rows copied from a table built with it).
    pub(crate) fn keep_error(&mut self, error: Option<QuantError>) {
        self.error = error.map_or_else(ErrorSum::default, |q| ErrorSum {
            max: q.max_abs,
            sum: q.mean_abs * q.values as f64,
            values: q.values,
        });
    }

    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// Appends rows given as a row-major `[n, dim]` fp32 array, encoding them to the table's dtype.
    pub fn write_f32(&mut self, values: &[f32]) -> Result<()> {
        let dim = self.spec.dim as usize;
        if !values.len().is_multiple_of(dim) {
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "got {} values, not a whole number of rows of dim {dim}",
                    values.len()
                ),
            ));
        }
        let first = self.rows_written;
        if self.spec.dtype.is_quantized()
            && let Some(at) = values.iter().position(|v| !v.is_finite())
        {
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "row {} value {} is {}: {} rows hold finite values only",
                    first + (at / dim) as u64,
                    at % dim,
                    values[at],
                    self.spec.dtype
                ),
            ));
        }
        self.write_with((values.len() / dim) as u64, |row, out| {
            let i = (row - first) as usize * dim;
            out.copy_from_slice(&values[i..i + dim]);
        })
    }

    /// Appends rows already encoded in the table's dtype, back to back (`row_bytes` each). A
    /// row-wise quantised row's scale and bias must be finite.
    pub fn write_encoded(&mut self, bytes: &[u8]) -> Result<()> {
        let rb = self.layout.row_bytes as usize;
        if !bytes.len().is_multiple_of(rb) {
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "got {} bytes, not a whole number of {rb}-byte rows",
                    bytes.len()
                ),
            ));
        }
        let first = self.rows_written;
        let (dtype, dim) = (self.spec.dtype, self.spec.dim as usize);
        if dtype.code_bits().is_some()
            && let Some((k, row)) = bytes.chunks_exact(rb).enumerate().find(|(_, row)| {
                let (scale, bias) = dtype.scale_bias(row, dim);
                !(scale.is_finite() && bias.is_finite())
            })
        {
            let (scale, bias) = dtype.scale_bias(row, dim);
            return Err(FormatError::invalid_table(
                &self.spec.name,
                format!(
                    "row {}: scale {scale} and bias {bias}; a {dtype} row's are finite",
                    first + k as u64
                ),
            ));
        }
        self.write_rows((bytes.len() / rb) as u64, |row, out, _| {
            let i = (row - first) as usize * rb;
            out.copy_from_slice(&bytes[i..i + rb]);
            ErrorSum::default()
        })
    }

    /// Appends `n` rows produced by `fill(row, values)` (fp32, encoded here), in parallel. A
    /// lossy dtype's encoding error is measured as the rows are encoded (the table's
    /// [`QuantError`]).
    pub fn write_with(&mut self, n: u64, fill: impl Fn(u64, &mut [f32]) + Sync) -> Result<()> {
        let (dtype, dim) = (self.spec.dtype, self.spec.dim as usize);
        self.write_rows(n, |row, out, scratch| {
            match bytemuck::try_cast_slice_mut::<u8, f32>(out) {
                // fp32 rows are filled in place (chunks are 4-byte aligned, rows 4-byte multiples).
                Ok(values) if dtype == DType::Fp32 => {
                    fill(row, values);
                    ErrorSum::default()
                }
                _ => {
                    let (values, decoded) = scratch.split_at_mut(dim);
                    fill(row, values);
                    dtype.encode_row(values, out);
                    dtype.decode_row(out, decoded);
                    ErrorSum::of(values, decoded)
                }
            }
        })
    }

    /// Places rows `rows_written..rows_written + n` with `place(row, encoded_row, fp32_scratch)`
    /// (the scratch is `2 * dim` long; `place` returns the row's encoding error), spans in
    /// parallel, handing each full chunk to the writer thread.
    pub(crate) fn write_rows(
        &mut self,
        n: u64,
        place: impl Fn(u64, &mut [u8], &mut [f32]) -> ErrorSum + Sync,
    ) -> Result<()> {
        let end = self.rows_written + n;
        if end > self.spec.rows {
            return Err(FormatError::RowCount {
                table: self.spec.name.clone(),
                expected: self.spec.rows,
                written: end,
            });
        }
        let (layout, dim) = (self.layout, self.spec.dim as usize);
        let rps = layout.rows_per_span();
        let rb = layout.row_bytes as usize;
        while self.rows_written < end {
            let chunk_first = self.rows_written / self.chunk_rows * self.chunk_rows;
            let stop = end.min(chunk_first + self.chunk_rows);
            let lo = self.rows_written;
            let mut chunk = match self.chunk.take() {
                Some(c) => c,
                None => self.pipeline.empty_buffer(self.chunk_bytes),
            };
            let error = chunk
                .par_chunks_mut(layout.span_bytes() as usize)
                .enumerate()
                .map_init(
                    || vec![0f32; 2 * dim],
                    |scratch, (s, span)| {
                        let span_first = chunk_first + s as u64 * rps;
                        let mut error = ErrorSum::default();
                        for row in span_first.max(lo)..(span_first + rps).min(stop) {
                            let at = ((row - span_first) as usize) * rb;
                            error = error.add(place(row, &mut span[at..at + rb], scratch));
                        }
                        error
                    },
                )
                .reduce(ErrorSum::default, ErrorSum::add);
            self.error = self.error.add(error);
            self.rows_written = stop;
            if stop == chunk_first + self.chunk_rows {
                self.pipeline.send(chunk, self.chunk_bytes)?;
            } else {
                self.chunk = Some(chunk);
            }
        }
        Ok(())
    }

    /// Seals the table file; returns its manifest entry (without `sums`, which the store writer
    /// fills in when it has written them) and its sector sums.
    pub(crate) fn finish(mut self) -> Result<(TableMeta, SectorSums)> {
        if self.rows_written != self.spec.rows {
            return Err(FormatError::RowCount {
                table: self.spec.name.clone(),
                expected: self.spec.rows,
                written: self.rows_written,
            });
        }
        let total = self.layout.data_bytes();
        if let Some(chunk) = self.chunk.take() {
            let chunk_first = (self.rows_written - 1) / self.chunk_rows * self.chunk_rows;
            let start = self.layout.row_offset(chunk_first);
            self.pipeline.send(chunk, (total - start) as usize)?;
        }
        let (file, data_crc32c, sums) = self.pipeline.join()?;
        let header = TableHeader {
            version: TABLE_VERSION,
            dtype: self.spec.dtype,
            dim: self.spec.dim,
            block_bytes: self.spec.block_bytes,
            rows: self.spec.rows,
            row_bytes: self.layout.row_bytes,
            data_offset: DATA_OFFSET,
            data_bytes: total,
            data_crc32c,
        };
        seal(&file, &self.path, &header)?;
        let meta = TableMeta {
            name: self.spec.name.clone(),
            file: self.file_name.clone(),
            rows: self.spec.rows,
            dim: self.spec.dim,
            dtype: self.spec.dtype,
            row_bytes: self.layout.row_bytes,
            block_bytes: self.spec.block_bytes,
            data_bytes: total,
            data_crc32c,
            order: None,
            sums: None,
            keys: None,
            quant_error: self.error.report(),
        };
        Ok((meta, sums))
    }
}

impl std::fmt::Debug for TableWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableWriter")
            .field("spec", &self.spec)
            .field("rows_written", &self.rows_written)
            .finish()
    }
}

/// Writes and fsyncs a file kept beside table file `table` in `dir` (its name with `ext` for
/// `.nrt`); returns its name and CRC-32C.
pub(crate) fn write_beside(
    dir: &Path,
    table: &str,
    ext: &str,
    bytes: &[u8],
) -> Result<(String, u32)> {
    let file = table.replace(".nrt", ext);
    let path = dir.join(&file);
    let mut f = File::create(&path).map_err(|e| FormatError::io(&path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| FormatError::io(&path, e))?;
    Ok((file, crc32c::crc32c(bytes)))
}

/// Seals a table file whose data region is written: its header, its length, fsynced.
pub(crate) fn seal(file: &File, path: &Path, header: &TableHeader) -> Result<()> {
    let io = |e| FormatError::io(path, e);
    file.write_all_at(&header.encode(), 0).map_err(io)?;
    file.set_len(DATA_OFFSET + header.data_bytes).map_err(io)?;
    file.sync_all().map_err(io)
}
