//! Every kernel program (each instantiation a launch can ask for, `kernels::all_programs`) compiles with NVRTC
//! for sm_80, and for sm_90 where its module's code can differ there (`ModuleSource::branches_on_arch`: a
//! module marked `arch_specific`, compiled for sm_90a, the target it gets on an sm_90 device, or one that tests
//! `__CUDA_ARCH__` itself or in a header it includes), on parallel threads, with no GPU needed: a syntax error
//! in a `.cu` file or a wrong instantiation line fails here (CI installs the pinned NVRTC and CUDA header
//! wheels and sets `SDPA_REQUIRE_NVRTC=1`, so a missing NVRTC fails instead of skipping).
//! So does a program whose ptxas log reports a "Potential Performance Loss" (a serialized wgmma pipeline):
//! it would run correctly and slowly, which no CPU-only check sees otherwise.
//!
//! Variant programs (windows, softcap, ALiBi: 8 maskings beside the 3 plain ones) are compiled for one dtype
//! and head-dim class per family (`kernels::compile_check_programs`: bf16 at D = 128, every tile and load
//! path), which keeps the check within about a minute of its time before them; the plain programs are all
//! compiled. `SDPA_NVRTC_ONLY=text` compiles only the programs whose name contains `text` (local iteration).
//! `SDPA_NVRTC_ALL=1` compiles every program for both targets instead (`kernels::all_programs` and `fa3`'s
//! variant and ragged entries, which compile on first use and are not listed there: about 6 s each, minutes
//! more for the compile check and `warm_up_all`): slow, for checking a family whole.

use sdpa_cuda::program::Program;
use sdpa_cuda::{images, kernels, libs, modules, nvrtc};

#[test]
fn every_instantiation_compiles_for_sm80_and_sm90() {
    let required = std::env::var_os("SDPA_REQUIRE_NVRTC").is_some_and(|v| v == "1");
    let version = match nvrtc::version() {
        Ok(v) => v,
        Err(e) if !required => {
            eprintln!("skipping: {e}");
            return;
        }
        Err(e) => panic!("SDPA_REQUIRE_NVRTC=1 but {e}"),
    };
    let include = libs::include_dir();
    let Some(include) = include else {
        assert!(!required, "SDPA_REQUIRE_NVRTC=1 but no CUDA include dir (cuda_fp16.h) was found");
        eprintln!("skipping: NVRTC {version:?} found but no CUDA headers");
        return;
    };
    let inc = include.display().to_string();
    let only = std::env::var("SDPA_NVRTC_ONLY").ok();
    let all = std::env::var_os("SDPA_NVRTC_ALL").is_some_and(|v| v == "1");
    let set = if all {
        let mut every = kernels::all_programs();
        let on_first_use = kernels::fa3::variant_programs().into_iter().chain(kernels::fa3::ragged_programs());
        let more: Vec<Program> = on_first_use.filter(|p| !every.contains(p)).collect();
        every.extend(more);
        every
    } else {
        kernels::compile_check_programs()
    };
    let programs: Vec<Program> =
        set.into_iter().filter(|p| only.as_deref().is_none_or(|o| p.name.contains(o))).collect();
    let mut names: Vec<&str> = programs.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), programs.len(), "two programs share a name");
    // sm_90 as well only where its code can differ from sm_80's beyond the back end (unless every program
    // is asked for): the same front end twice was a third of CI's compile check.
    let jobs: Vec<(&Program, String)> = programs
        .iter()
        .flat_map(|p| ["sm_80", "sm_90"].map(|arch| (p, arch)))
        .filter(|(p, arch)| *arch == "sm_80" || all || p.module.branches_on_arch())
        .map(|(p, arch)| (p, p.module.arch_for(arch)))
        .collect();
    let threads = images::compile_threads().expect("SDPA_CUDA_COMPILE_THREADS, when set, is a count");
    eprintln!("NVRTC {version:?}, headers from {inc}: {} compiles on up to {threads} threads", jobs.len());
    let started = std::time::Instant::now();
    let compile = |(program, arch): &(&Program, String)| -> (f64, Result<(), String>) {
        let opts = nvrtc::options(arch, Some(&inc), program.module);
        let t = std::time::Instant::now();
        let outcome = nvrtc::compile(program, arch, &opts).map_err(|e| e.to_string()).and_then(|c| {
            // The entry an instantiation names must be a symbol of the image: its name between NULs in
            // the ELF string table (a bare substring could sit inside a longer symbol). A whole module's
            // entries are looked up by name at launch and tested on the GPU.
            let symbol = [b"\0", program.name.as_bytes(), b"\0"].concat();
            let has_entry = program.is_whole() || c.cubin.windows(symbol.len()).any(|w| w == symbol);
            // ptxas compiles code it had to slow down and only says so in the log: a wgmma pipeline it
            // serialized (C7520, e.g. a branch around wgmma instructions it cannot prove uniform) ran causal
            // fa3 at 0.70x of itself in session 21, with every test passing.
            let losses: Vec<&str> = c.log.lines().filter(|l| l.contains("Performance Loss")).collect();
            match (c.cubin.len() > 1000, has_entry, losses.is_empty()) {
                (true, true, true) => Ok(()),
                (false, _, _) => Err(format!("{} {arch}: suspiciously small cubin", program.name)),
                (_, false, _) => Err(format!("{} {arch}: the image lacks its entry point", program.name)),
                (_, _, false) => Err(format!("{} {arch}: ptxas reports\n{}", program.name, losses.join("\n"))),
            }
        });
        (t.elapsed().as_secs_f64(), outcome)
    };
    let panicked =
        |(p, arch): &(&Program, String)| (0.0, Err(format!("{} {arch}: the compile thread panicked", p.name)));
    let results = images::parallel_map(&jobs, threads, compile, panicked);
    let slowest = results.iter().zip(&jobs).max_by(|a, b| a.0 .0.total_cmp(&b.0 .0));
    if let Some(((secs, _), (p, arch))) = slowest {
        eprintln!("{} compiles in {:.1?}; slowest {} {arch} {secs:.2} s", jobs.len(), started.elapsed(), p.name);
    }
    let failures: Vec<String> = results.into_iter().filter_map(|(_, r)| r.err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_syntax_error_keeps_the_compiler_log() {
    if nvrtc::version().is_err() || libs::include_dir().is_none() {
        eprintln!("skipping: NVRTC or CUDA headers not found");
        return;
    }
    // Both kinds of program: a whole module, and an instantiation line that names no macro of its family.
    static BROKEN: modules::ModuleSource =
        modules::ModuleSource::new("broken", "extern \"C\" __global__ void k() { int x = ; }");
    let inc = libs::include_dir().map(|p| p.display().to_string());
    let opts = nvrtc::options("sm_90", inc.as_deref(), &BROKEN);
    let err = nvrtc::compile(&Program::whole(&BROKEN), "sm_90", &opts).expect_err("must not compile");
    let text = err.to_string();
    assert!(text.contains("broken.cu") && text.contains("expected an expression"), "{text}");
    let typo = Program::entry(&modules::FA2, "fa2_bf16_128_none", "FA2_ENTYR(fa2_bf16_128_none, __nv_bfloat16)");
    let err = nvrtc::compile(&typo, "sm_90", &nvrtc::options("sm_90", inc.as_deref(), typo.module))
        .expect_err("must not compile");
    // The compiler's own complaint about the line, in the log the error keeps.
    assert!(err.to_string().contains("FA2_ENTYR"), "{err}");
}
