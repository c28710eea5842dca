//! The model's chat template (the Jinja template its GGUF file carries, rendered as Hugging
//! Face's tokenizers and llama-server render it): a conversation as the prompt the model was
//! trained on, ending where the assistant's answer starts, or inside a final assistant
//! message that the answer continues.

use minijinja::{Environment, Error, ErrorKind, context};
use serde_json::json;
use streamgate_cli::serve::{Role, Turn};

/// A model's chat template, and the special tokens it may name.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template `source`, whose `bos_token` and `eos_token` are `bos` and `eos`.
    ///
    /// # Errors
    ///
    /// When `source` is not a template minijinja can read.
    pub fn new(source: String, bos: String, eos: String) -> Result<Self, String> {
        let mut env = Environment::new();
        // Python's string and list methods (`.strip()`, `.startswith()`), which templates call.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned("chat", source)
            .map_err(|error| format!("the model's chat template: {error}"))?;
        Ok(ChatTemplate { env, bos, eos })
    }

    /// The BOS token's text (empty for a model without one).
    pub fn bos(&self) -> &str {
        &self.bos
    }

    /// The prompt for `conversation`: up to the start of the assistant's answer or, when
    /// `continues`, with the final (assistant) message's text left open for the answer to
    /// continue.
    ///
    /// # Errors
    ///
    /// What the template raised (a role it does not take, say), in its words.
    pub fn prompt(&self, conversation: &[Turn], continues: bool) -> Result<String, String> {
        let (before, open) = match conversation.split_last() {
            Some((last, before)) if continues => (before, last.text.as_str()),
            _ => (conversation, ""),
        };
        let messages: Vec<_> = before
            .iter()
            .map(|turn| json!({"role": role(turn.role), "content": turn.text}))
            .collect();
        let template = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut prompt = template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos,
                eos_token => self.eos,
            })
            .map_err(|error| format!("the model's chat template: {error}"))?;
        prompt.push_str(open);
        Ok(prompt)
    }
}

/// The role a template knows a turn by: OpenAI's `developer` is the system prompt, which
/// templates written before it call `system`.
fn role(role: Role) -> &'static str {
    match role {
        Role::Developer => Role::System.as_str(),
        other => other.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2's template, as its GGUF file carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn turn(role: Role, text: &str) -> Turn {
        Turn {
            role,
            text: text.into(),
        }
    }

    #[test]
    fn a_conversation_becomes_the_prompt_the_model_was_trained_on() {
        let developer = [turn(Role::Developer, "Be brief."), turn(Role::User, "Hi")];
        let system = [turn(Role::System, "Be brief."), turn(Role::User, "Hi")];
        let template = ChatTemplate::new(SMOLLM2.into(), String::new(), String::new()).unwrap();
        let user = [turn(Role::User, "Hi")];
        assert_eq!(
            template.prompt(&user, false).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let continued = [
            turn(Role::System, "Be brief."),
            turn(Role::User, "Hi"),
            turn(Role::Assistant, "Hello, I"),
        ];
        assert_eq!(
            template.prompt(&continued, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello, I",
            "the final message left open"
        );
        assert_eq!(
            template.prompt(&developer, false),
            template.prompt(&system, false),
            "a developer message is the system prompt"
        );
    }

    #[test]
    fn what_a_template_raises_is_an_error_not_a_panic() {
        let strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('users first') }}\
                      {% endif %}{{ bos_token }}{{ messages[0]['content'].strip() }}";
        let template = ChatTemplate::new(strict.into(), "<s>".into(), "</s>".into()).unwrap();
        let error = template
            .prompt(&[turn(Role::Assistant, "x")], false)
            .unwrap_err();
        assert!(error.contains("users first"), "{error}");
        assert_eq!(
            template.prompt(&[turn(Role::User, " hi ")], false).unwrap(),
            "<s>hi"
        );
        assert!(ChatTemplate::new("{% if %}".into(), String::new(), String::new()).is_err());
    }
}
