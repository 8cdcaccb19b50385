//! Python on the executors without Python on the client: session Python files
//! (`AddArtifacts` `pyfiles/…`) and `mapInArrow` relations whose function is a
//! tiny protocol-0 pickle calling a factory in such a file.

use bytes::Bytes;
use spark_connect_proto::common_inline_user_defined_function::Function;
use spark_connect_proto::data_type::{Kind, Unparsed};
use spark_connect_proto::relation::RelType;
use spark_connect_proto::{self as proto, CommonInlineUserDefinedFunction, DataType};

use crate::column::Column;
use crate::dataframe::DataFrame;
use crate::error::{Error, Result};
use crate::session::SparkSession;

/// Spark's `PythonEvalType.SQL_MAP_ARROW_ITER_UDF` (`DataFrame.mapInArrow`).
pub const SQL_MAP_ARROW_ITER_UDF: i32 = 207;

/// A `mapInArrow` function that runs on the executors: `module.factory(*args)`
/// must return `(function, schema)` where `function` maps an iterator of
/// `pyarrow.RecordBatch` to an iterator of `pyarrow.RecordBatch` with the
/// columns of `output_ddl`.
///
/// The function travels as a protocol-0 pickle of the call
/// `module.factory(*args)` (string arguments only), so the client needs no
/// Python; the executors import `module` (e.g. from a file added with
/// [`SparkSession::add_python_file`]).
///
/// ```
/// use kindling_spark::MapInArrowUdf;
/// let udf = MapInArrowUdf::new("kindling_push", "udf_command", "n long", "3.11")
///     .arg(r#"{"job_id": "j"}"#);
/// assert!(udf.command().starts_with(b"ckindling_push\nudf_command\n("));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapInArrowUdf {
    module: String,
    factory: String,
    args: Vec<String>,
    output_ddl: String,
    python_version: String,
    inputs: Vec<String>,
}

impl MapInArrowUdf {
    /// `module.factory()` producing rows of `output_ddl` (a Spark DDL such as
    /// `"id long, name string"`), for executors running Python `python_version`
    /// (`major.minor`, sent as `python_ver`; some Spark releases' workers
    /// refuse another version than their own).
    pub fn new(
        module: impl Into<String>,
        factory: impl Into<String>,
        output_ddl: impl Into<String>,
        python_version: impl Into<String>,
    ) -> Self {
        MapInArrowUdf {
            module: module.into(),
            factory: factory.into(),
            args: Vec::new(),
            output_ddl: output_ddl.into(),
            python_version: python_version.into(),
            inputs: Vec::new(),
        }
    }

    /// Appends a string argument of the factory call.
    pub fn arg(mut self, value: impl Into<String>) -> Self {
        self.args.push(value.into());
        self
    }

    /// The input columns, as PySpark's `mapInArrow` names every column of its
    /// DataFrame: the plan then says the function reads them. Without them
    /// Spark may hand the function batches with no columns (and no rows)
    /// when a query needs none of its output, e.g. `count(*)` over it.
    pub fn inputs<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.inputs = columns.into_iter().map(Into::into).collect();
        self
    }

    /// The pickled call `module.factory(*args)` (pickle protocol 0: `GLOBAL`,
    /// `MARK`, one `UNICODE` per argument, `TUPLE`, `REDUCE`, `STOP`).
    pub fn command(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.args.iter().map(String::len).sum::<usize>());
        out.push(b'c');
        out.extend_from_slice(self.module.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(self.factory.as_bytes());
        out.extend_from_slice(b"\n(");
        for arg in &self.args {
            out.push(b'V');
            out.extend_from_slice(raw_unicode_escape(arg).as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(b"tR.");
        out
    }

    fn check(&self) -> Result<()> {
        let ident = |s: &str, dotted: bool| {
            !s.is_empty()
                && s.split('.').all(|part| {
                    part.chars()
                        .next()
                        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                        && part.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
                })
                && (dotted || !s.contains('.'))
        };
        if !ident(&self.module, true) {
            return Err(Error::InvalidArgument(format!(
                "`{}` is not a Python module name",
                self.module
            )));
        }
        if !ident(&self.factory, false) {
            return Err(Error::InvalidArgument(format!(
                "`{}` is not a Python function name",
                self.factory
            )));
        }
        let version_ok = self.python_version.split_once('.').is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.chars().all(|c| c.is_ascii_digit())
                && b.chars().all(|c| c.is_ascii_digit())
        });
        if !version_ok {
            return Err(Error::InvalidArgument(format!(
                "the executors' Python version must be `major.minor` (e.g. \"3.11\"), got `{}`",
                self.python_version
            )));
        }
        if self.output_ddl.trim().is_empty() {
            return Err(Error::InvalidArgument("the output schema (DDL) is empty".into()));
        }
        Ok(())
    }
}

/// Python's `raw-unicode-escape` as pickle protocol 0 writes it: `\`, NUL, CR,
/// LF and SUB escaped, everything beyond ASCII as `\uXXXX` / `\UXXXXXXXX`.
fn raw_unicode_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '\0' | '\n' | '\r' | '\u{1a}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if c.is_ascii() => out.push(c),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out
}

impl DataFrame {
    /// `mapInArrow`: runs `udf` on every partition on the executors (Spark
    /// Connect `MapPartitions`, eval type 207); the result has the columns of
    /// the UDF's output DDL.
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// use kindling_spark::MapInArrowUdf;
    /// spark.add_python_file("counting.py", "def udf():\n    ...\n").await?;
    /// let udf = MapInArrowUdf::new("counting", "udf", "rows long", "3.11");
    /// let per_partition = spark.range(0, 100, 1).map_in_arrow(&udf)?.collect().await?;
    /// # Ok(()) }
    /// ```
    pub fn map_in_arrow(&self, udf: &MapInArrowUdf) -> Result<DataFrame> {
        udf.check()?;
        let func = CommonInlineUserDefinedFunction {
            function_name: udf.factory.clone(),
            deterministic: true,
            arguments: udf
                .inputs
                .iter()
                .map(|c| Column::attribute(&format!("`{}`", c.replace('`', "``")), None).expr)
                .collect(),
            function: Some(Function::PythonUdf(proto::PythonUdf {
                output_type: Some(DataType {
                    kind: Some(Kind::Unparsed(Unparsed {
                        data_type_string: udf.output_ddl.clone(),
                    })),
                }),
                eval_type: SQL_MAP_ARROW_ITER_UDF,
                command: Bytes::from(udf.command()),
                python_ver: udf.python_version.clone(),
                additional_includes: Vec::new(),
            })),
            is_distinct: false,
        };
        Ok(self
            .session()
            .dataframe(RelType::MapPartitions(Box::new(proto::MapPartitions {
                input: Some(Box::new(self.relation().clone())),
                func: Some(func),
                is_barrier: None,
                profile_id: None,
            }))))
    }
}

impl SparkSession {
    /// Adds a Python source file to the session (`pyfiles/<name>`): the
    /// executors can import it in Python functions of this session, with nothing
    /// installed on them. Adding the same content again is a no-op; Spark
    /// refuses different content under a name already added.
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// spark.add_python_file("helpers.py", "def twice(x):\n    return 2 * x\n").await?;
    /// # Ok(()) }
    /// ```
    pub async fn add_python_file(&self, name: &str, source: impl Into<Bytes>) -> Result<()> {
        let stem = name.strip_suffix(".py").unwrap_or("");
        if stem.is_empty()
            || name.contains('/')
            || !stem.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
        {
            return Err(Error::InvalidArgument(format!(
                "`{name}` is not an importable Python file name (`module.py`)"
            )));
        }
        self.add_artifacts(vec![(format!("pyfiles/{name}"), source.into())])
            .await
    }

    /// Adds a Python package to the session as one zip (`pyfiles/<package>.zip`,
    /// its `files` under `<package>/`): the executors can `import
    /// <package>.<module>` in Python functions of this session, with nothing
    /// installed on them. Each file is `(name.py, source)`, `__init__.py`
    /// among them.
    ///
    /// ```no_run
    /// # async fn demo(spark: kindling_spark::SparkSession) -> Result<(), kindling_spark::Error> {
    /// spark.add_python_package("helpers", &[("__init__.py", ""), ("twice.py", "def twice(x):\n    return 2 * x\n")]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn add_python_package(&self, package: &str, files: &[(&str, &str)]) -> Result<()> {
        let archive = python_package_zip(package, files)?;
        self.add_artifacts(vec![(format!("pyfiles/{package}.zip"), Bytes::from(archive))])
            .await
    }
}

/// `files` as a zip of the package `package` (entries deflated, at a fixed
/// time, so that the same files make the same bytes and Spark sees the same
/// artifact again).
fn python_package_zip(package: &str, files: &[(&str, &str)]) -> Result<Vec<u8>> {
    let identifier = |s: &str| {
        !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
    };
    if !identifier(package) {
        return Err(Error::InvalidArgument(format!(
            "`{package}` is not an importable Python package name"
        )));
    }
    if !files.iter().any(|(name, _)| *name == "__init__.py") {
        return Err(Error::InvalidArgument(format!(
            "package `{package}` has no `__init__.py`"
        )));
    }
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .last_modified_time(zip::DateTime::default());
    let failed =
        |e: &dyn std::fmt::Display| Error::InvalidArgument(format!("zipping package `{package}`: {e}"));
    for (name, source) in files {
        if !name.strip_suffix(".py").is_some_and(identifier) {
            return Err(Error::InvalidArgument(format!(
                "`{name}` in package `{package}` is not a Python module file"
            )));
        }
        zip.start_file(format!("{package}/{name}"), options)
            .map_err(|e| failed(&e))?;
        std::io::Write::write_all(&mut zip, source.as_bytes()).map_err(|e| failed(&e))?;
    }
    Ok(zip.finish().map_err(|e| failed(&e))?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The zip holds the package's files under its folder, byte for byte,
    /// the same bytes each time (Spark sees one artifact), and what could not
    /// be imported is refused, named.
    #[test]
    fn a_package_zips_under_its_folder_the_same_each_time() {
        let files = [
            ("__init__.py", "from .a import one\n"),
            ("a.py", "def one():\n    return 1\n"),
        ];
        let zip = python_package_zip("pkg", &files).expect("zip");
        assert_eq!(
            zip,
            python_package_zip("pkg", &files).expect("zip"),
            "deterministic"
        );
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip)).expect("a zip");
        assert_eq!(archive.len(), 2);
        for (name, source) in files {
            let mut entry = archive.by_name(&format!("pkg/{name}")).expect("entry");
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text).expect("read");
            assert_eq!(text, source);
        }
        let refused = |package: &str, files: &[(&str, &str)]| match python_package_zip(package, files) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(refused("my-pkg", &files).contains("`my-pkg` is not an importable"));
        assert!(refused("pkg", &files[1..]).contains("no `__init__.py`"));
        assert!(refused("pkg", &[("__init__.py", ""), ("a/b.py", "")]).contains("`a/b.py`"));
    }

    #[test]
    fn the_command_is_a_protocol_0_call_of_the_factory() {
        let bare = MapInArrowUdf::new("kindling_push", "udf_command", "n long", "3.11");
        assert_eq!(bare.command(), b"ckindling_push\nudf_command\n(tR.");
        assert_eq!(bare.command().len(), 31);
        let with_arg = bare.arg("a\\b\nc é 😀");
        assert_eq!(
            with_arg.command(),
            b"ckindling_push\nudf_command\n(Va\\u005cb\\u000ac \\u00e9 \\U0001f600\ntR."
        );
    }

    #[test]
    fn bad_names_and_versions_are_refused() {
        let ok = MapInArrowUdf::new("pkg.mod", "f", "n long", "3.11");
        assert!(ok.check().is_ok());
        for (udf, needle) in [
            (
                MapInArrowUdf::new("bad-mod", "f", "n long", "3.11"),
                "module name",
            ),
            (MapInArrowUdf::new("m", "f\nx", "n long", "3.11"), "function name"),
            (MapInArrowUdf::new("m", "f", "n long", "3"), "major.minor"),
            (MapInArrowUdf::new("m", "f", " ", "3.11"), "output schema"),
        ] {
            let e = udf.check().expect_err("refused").to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
