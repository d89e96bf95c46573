//! Programs: creation from source, binary, IL or built-in kernels; build, compile, link.

use rgpu_cl_api::sys;
use rgpu_cl_api::validate;
use rgpu_protocol::opencl::{serve, Answer, BinaryStatus, Id, IncludeDir};

use super::answer;
use crate::opencl::native::{ClResult, Program};
use crate::session::Session;

/// Runs a build or compile with `-cl-kernel-arg-info` added, so the kernels keep their
/// argument info and the client can check clSetKernelArg values locally (see ArgKind). Some
/// compilers fail on the option for some programs (NVIDIA's ptxas on an argument-less
/// kernel), so a failure is retried with the options exactly as given: the result, status and
/// build log are then the program's own.
fn with_arg_info(options: &str, mut run: impl FnMut(&str) -> ClResult<()>) -> ClResult<()> {
    if options
        .split_whitespace()
        .any(|o| o == "-cl-kernel-arg-info")
    {
        return run(options);
    }
    run(&format!("{options} -cl-kernel-arg-info")).or_else(|_| run(options))
}

impl serve::Programs for Session {
    fn create_program_with_source(&mut self, id: Id, context: Id, source: String) -> Answer<()> {
        self.cl.handles.programs.check_free(id)?;
        let program = self
            .cl
            .handles
            .contexts
            .get(context)?
            .create_program_with_source(&super::confine::confine_source(&source))?;
        self.cl.handles.programs.insert(id, program)
    }

    fn create_program_with_binary(
        &mut self,
        id: Id,
        context: Id,
        devices: Vec<Id>,
        binaries: Vec<Vec<u8>>,
    ) -> BinaryStatus {
        let failed = |status| BinaryStatus {
            status,
            binary_status: vec![sys::CL_INVALID_VALUE; devices.len()],
        };
        if let Err(e) = self.cl.handles.programs.check_free(id) {
            return failed(e);
        }
        let natives = match self.native_devices(&devices) {
            Ok(natives) => natives,
            Err(e) => return failed(e),
        };
        let context = match self.cl.handles.contexts.get(context) {
            Ok(context) => context,
            Err(e) => return failed(e),
        };
        let (program, binary_status) = context.create_program_with_binary(&natives, &binaries);
        let status = match program.and_then(|p| self.cl.handles.programs.insert(id, p)) {
            Ok(()) => sys::CL_SUCCESS,
            Err(e) => e,
        };
        BinaryStatus {
            status,
            binary_status,
        }
    }

    fn create_program_with_il(&mut self, id: Id, context: Id, il: Vec<u8>) -> Answer<()> {
        self.cl.handles.programs.check_free(id)?;
        let program = self
            .cl
            .handles
            .contexts
            .get(context)?
            .create_program_with_il(&il)?;
        self.cl.handles.programs.insert(id, program)
    }

    fn create_program_with_built_in_kernels(
        &mut self,
        id: Id,
        context: Id,
        devices: Vec<Id>,
        names: String,
    ) -> Answer<()> {
        self.cl.handles.programs.check_free(id)?;
        let natives = self.native_devices(&devices)?;
        let program = self
            .cl
            .handles
            .contexts
            .get(context)?
            .create_program_with_built_in_kernels(&natives, &names)?;
        self.cl.handles.programs.insert(id, program)
    }

    fn build_program(
        &mut self,
        program: Id,
        devices: Vec<Id>,
        options: String,
        includes: Vec<IncludeDir>,
    ) -> Answer<()> {
        validate::build_options(&options)?;
        let options = self.stage_includes(&options, &includes)?;
        let options = super::confine::confine_options(&options, &self.include_root()?)?;
        let natives = self.native_devices(&devices)?;
        let program = self.cl.handles.programs.get(program)?;
        with_arg_info(&options, |options| program.build(&natives, options))
    }

    fn compile_program(
        &mut self,
        program: Id,
        devices: Vec<Id>,
        options: String,
        headers: Vec<(Id, String)>,
        includes: Vec<IncludeDir>,
    ) -> Answer<()> {
        validate::build_options(&options)?;
        let options = self.stage_includes(&options, &includes)?;
        let options = super::confine::confine_options(&options, &self.include_root()?)?;
        let natives = self.native_devices(&devices)?;
        let headers: Vec<(&Program, &str)> = headers
            .iter()
            .map(|(id, name)| Ok((self.cl.handles.programs.get(*id)?, name.as_str())))
            .collect::<ClResult<_>>()?;
        let program = self.cl.handles.programs.get(program)?;
        with_arg_info(&options, |options| {
            program.compile(&natives, options, &headers)
        })
    }

    /// A program the implementation returned despite a failed link is kept under `id` so
    /// its build log can be read.
    fn link_program(
        &mut self,
        id: Id,
        context: Id,
        devices: Vec<Id>,
        options: String,
        inputs: Vec<Id>,
    ) -> Answer<()> {
        validate::build_options(&options)?;
        let options = super::confine::confine_options(&options, &self.include_root()?)?;
        let result = (|| -> ClResult<(Option<Program>, i32)> {
            self.cl.handles.programs.check_free(id)?;
            let natives = self.native_devices(&devices)?;
            let inputs: Vec<&Program> = inputs
                .iter()
                .map(|&i| self.cl.handles.programs.get(i))
                .collect::<ClResult<_>>()?;
            Ok(self
                .cl
                .handles
                .contexts
                .get(context)?
                .link_program(&natives, &options, &inputs))
        })();
        let (program, status) = result?;
        if let Some(program) = program {
            self.cl.handles.programs.insert(id, program)?;
        }
        answer(status)
    }
}
